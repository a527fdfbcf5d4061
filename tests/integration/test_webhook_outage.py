"""A receiver's outage on the production retry schedule, without waiting for it.

What the Celery tasks call (``fan_out_pending``, then ``deliver_due`` with the worker's
``WebhookSender``), run here step by step on an injected clock, against a real receiver on
loopback that verifies with ``standardwebhooks``, dedupes by ``webhook-id`` and stamps
each arrival with the same clock. Real time would take a day; freezegun would stop the
HTTP client's own timeouts, so only the clock the domain is given moves.

Duplicates: no reply is ever lost here (a refused connection and a 503 are both answers
the sender sees), so the wire must carry no duplicate at all: each ``webhook-id`` arrives
exactly as many times as the log shows attempts that reached the receiver, and is
accepted once.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter, defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from metering.config import Settings
from metering.settlement.runner import settle_due_now
from metering.webhooks.delivery import deliver_due
from metering.webhooks.fanout import fan_out_pending
from metering.webhooks.schedule import JITTER
from reconciler.webhook_sender import WebhookSender
from tests.helpers.events import auth, usage
from tests.helpers.ingest import ingest
from tests.helpers.scenarios import scenario
from tests.helpers.webhooks import Receiver, add_endpoint, messages, notify

PRODUCTION_SCHEDULE_S = [5, 300, 1800, 7200, 18000, 36000, 36000]


class Clock:
    """The time the domain is told; moves only when the test says."""

    def __init__(self, start: datetime) -> None:
        self._now = start
        self._lock = threading.Lock()

    def __call__(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += timedelta(seconds=seconds)

    def move_to(self, moment: datetime) -> None:
        with self._lock:
            self._now = max(self._now, moment)


@pytest.fixture
def production(settings: Settings) -> Settings:
    """The default settings, but for loopback targets (the receiver is on 127.0.0.1)."""
    allowed = settings.model_copy(update={"webhooks_allow_private": True})
    assert allowed.webhooks_retry_schedule_s == PRODUCTION_SCHEDULE_S
    assert allowed.webhooks_disable_after_s == 3 * 24 * 3600
    return allowed


@pytest.fixture
def sender() -> Iterator[WebhookSender]:
    client = WebhookSender()
    yield client
    client.close()


def beat(engine: Any, settings: Settings, sender: WebhookSender, clock: Clock) -> None:
    """One beat of the worker: the fan-out task, then the delivery task."""
    fan_out_pending(engine, settings, clock)
    deliver_due(engine, settings, sender, clock)


def attempts_by_message(db: Any) -> dict[str, list[tuple[Any, ...]]]:
    """msg_id → its attempts (number, outcome, started_at, status, error), in order."""
    rows = db.execute(
        "SELECT m.msg_id, a.attempt, a.outcome, a.started_at, a.status_code, a.error "
        "FROM webhook_attempts a JOIN webhook_messages m ON m.id = a.message_id "
        "ORDER BY m.msg_id, a.attempt"
    ).fetchall()
    found: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
    for msg_id, *attempt in rows:
        found[msg_id].append(tuple(attempt))
    return found


def assert_no_attempt_before_its_retry_was_due(
    attempts: dict[str, list[tuple[Any, ...]]], step_s: float, breaker_s: float = 0.0
) -> None:
    """Consecutive attempts of a message are at least the jittered wait apart, and no more
    than the wait, its jitter, one beat of the test's clock and ``breaker_s``: while the
    endpoint fails, its circuit breaker lets one probe through per round and pauses between
    them, so messages falling due together at a failing endpoint go one after another
    (docs/webhooks.md "Fair share": the breaker delays, it never fails a message)."""
    for msg_id, tried in attempts.items():
        for number, (earlier, later) in enumerate(itertools.pairwise(tried)):
            wait_s = (later[2] - earlier[2]).total_seconds()
            step = PRODUCTION_SCHEDULE_S[number]
            assert wait_s >= step * (1 - JITTER) - 1e-3, (msg_id, number + 1, wait_s)
            most = step * (1 + JITTER) + step_s + breaker_s + 1e-3
            assert wait_s <= most, (msg_id, number + 1, wait_s)


def test_a_ten_minute_outage_on_the_production_schedule_loses_nothing_and_doubles_nothing(
    engine, production, db, sender, client, make_key
):
    start = datetime.now(UTC)
    clock = Clock(start)
    receiver = Receiver(clock=clock).start()
    endpoint_id, secret = add_endpoint(engine, production, receiver.url)
    receiver.secrets = [secret]

    # Three runs ingested and settled through the real use cases; one gets a late event and
    # is settled again: run.settled, then run.resettled, both waiting in its line.
    began = start - timedelta(minutes=30)
    for name in ("r1", "r2", "r3"):
        ingest(engine, production, scenario("completed", name, "c1", began))
    settle_due_now(engine, production)
    late = usage(
        run="r1", customer="c1", step=3, model="agent-small-1", time=began + timedelta(minutes=2)
    )
    ingest(engine, production, [late])
    settle_due_now(engine, production)
    told = [t for (t,) in db.execute("SELECT type FROM notifications WHERE subject = 'r1'")]
    assert told.index("run.settled") < told.index("run.resettled")

    # The outage: 503s for two minutes, then nothing listening, ten minutes in all; the
    # worker beats every 2 s of the clock. Halfway, another run's news arrives.
    receiver.status = 503
    step_s = 2.0
    while clock() - start < timedelta(minutes=10):
        if clock() - start >= timedelta(minutes=2) and receiver.status == 503:
            receiver.stop()
            receiver.status = 200
        if clock() - start == timedelta(minutes=5):
            ingest(engine, production, scenario("completed", "r4", "c1", began))
        beat(engine, production, sender, clock)
        clock.advance(step_s)
    assert {m[3] for m in messages(db, endpoint_id)} == {"pending"}
    assert not receiver.accepted()

    # Back. The next retries are due only at the schedule's next step (30 min ± a fifth
    # after the third attempt); the clock goes on in beats of 5 s until they are.
    back_at = clock()
    # (Messages never tried wait behind their run's head; their own time is long past.)
    due = db.execute(
        "SELECT min(next_attempt_at) FROM webhook_messages "
        "WHERE status = 'pending' AND attempts > 0"
    ).fetchone()[0]
    receiver.start()
    step_s = 5.0
    while clock() - back_at < timedelta(hours=2):
        beat(engine, production, sender, clock)
        if {m[3] for m in messages(db, endpoint_id)} == {"delivered"}:
            break
        clock.advance(step_s)
    receiver.stop()

    made = messages(db, endpoint_id)
    expected = {m[0] for m in made}
    assert {m[3] for m in made} == {"delivered"}, "every message delivered"
    assert set(receiver.processed) == expected
    assert all(r.verified for r in receiver.requests)
    # Nothing reached the receiver between its return and the first retry the schedule
    # allowed, and that retry was not late by more than a beat.
    after = [r.at for r in receiver.requests if r.at is not None and r.at >= back_at]
    assert min(after) >= due and min(after) - due <= timedelta(seconds=step_s)

    # None twice: accepted once each; on the wire exactly the attempts that got an answer.
    accepted = Counter(r.msg_id for r in receiver.accepted())
    assert set(accepted.values()) == {1}
    arrivals = Counter(r.msg_id for r in receiver.requests)
    attempts = attempts_by_message(db)
    for msg_id in expected:
        answered = [a for a in attempts[msg_id] if a[3] is not None]
        assert arrivals[msg_id] == len(answered), msg_id

    # Per-run order: each run's messages accepted in notification order, and none tried
    # before the one ahead of it was accepted.
    by_run: dict[str, list[str]] = defaultdict(list)
    for msg_id, run, *_ in made:
        by_run[run].append(msg_id)
    assert set(by_run) == {"r1", "r2", "r3", "r4"}
    for run, ids in by_run.items():
        for earlier, later in itertools.pairwise(ids):
            accepted_seq = min(r.answered_seq for r in receiver.accepted() if r.msg_id == earlier)
            assert accepted_seq < min(r.seq for r in receiver.received(later)), run
    r1_types = [r.payload["type"] for r in receiver.accepted() if r.msg_id in by_run["r1"]]
    assert r1_types.index("run.settled") < r1_types.index("run.resettled")

    # The log shows every failed attempt with its error; the heads of the lines were tried
    # four times: 503, 503, refused, then delivered.
    # The heads of the four lines were retried at a failing endpoint: each may wait behind
    # the others' probes, a beat and at most one breaker pause each.
    breaker_s = len(by_run) * (production.webhooks_breaker_max_pause_s + 5.0)
    assert_no_attempt_before_its_retry_was_due(attempts, step_s=5.0, breaker_s=breaker_s)
    heads = [ids[0] for run, ids in by_run.items() if run != "r4"]
    for msg_id in heads:
        tried = attempts[msg_id]
        assert [(a[1], a[3]) for a in tried] == [
            ("failed", 503),
            ("failed", 503),
            ("failed", None),
            ("delivered", 200),
        ], msg_id
        assert "ConnectError" in tried[2][4]
    log = client.get(
        f"/v1/webhooks/endpoints/{endpoint_id}/deliveries",
        params={"limit": 200},
        headers=auth(make_key(scope="admin")),
    ).json()
    shown = {d["message_id"]: d for d in log["deliveries"]}
    assert set(shown) == expected
    for msg_id in heads:
        entry = shown[msg_id]
        assert (entry["status"], entry["attempt_count"]) == ("delivered", 4)
        shown_attempts = sorted(entry["attempts"], key=lambda a: a["attempt"])
        assert [a["status_code"] for a in shown_attempts] == [503, 503, None, 200]
        assert [a["response_excerpt"] for a in shown_attempts[:2]] == ['{"ok": false}'] * 2
        assert "ConnectError" in shown_attempts[2]["error"]


def test_a_message_failing_past_the_last_retry_is_failed_and_an_endpoint_failing_3_days_is_disabled(
    engine, production, db, sender, client, make_key
):
    """What a Svix user expects, on the production schedule: eight attempts over about 28
    hours, then the message is ``failed`` and shown so; the endpoint stays enabled until
    every attempt has failed for three days, then is disabled with a reason its admin
    reads, and is sent nothing more."""
    start = datetime.now(UTC)
    clock = Clock(start)
    admin = auth(make_key(scope="admin"))
    receiver = Receiver(clock=clock, status=503).start()
    endpoint_id, secret = add_endpoint(engine, production, receiver.url)
    receiver.secrets = [secret]
    first = notify(engine, "statement.closed", period="2026-11")

    def pending_due() -> datetime | None:
        row = db.execute(
            "SELECT min(next_attempt_at) FROM webhook_messages WHERE status = 'pending'"
        ).fetchone()
        return row[0] if row else None

    # Beat, then jump the clock to the next retry that falls due: nothing else happens.
    beat(engine, production, sender, clock)
    while (due := pending_due()) is not None:
        clock.move_to(due)
        beat(engine, production, sender, clock)
    [(msg_id, _, notification_id, status, attempt_count)] = messages(db, endpoint_id)
    assert (notification_id, status, attempt_count) == (first, "failed", 8)
    tried = attempts_by_message(db)[msg_id]
    assert [(a[1], a[3]) for a in tried] == [("failed", 503)] * 8
    assert_no_attempt_before_its_retry_was_due({msg_id: tried}, step_s=0.0)
    assert timedelta(hours=22) < tried[-1][2] - start < timedelta(hours=34)
    assert len(receiver.received(msg_id)) == 8 and not receiver.processed

    log = client.get(f"/v1/webhooks/endpoints/{endpoint_id}/deliveries", headers=admin).json()
    [shown] = log["deliveries"]
    assert (shown["status"], shown["next_attempt_at"]) == ("failed", None)
    assert shown["finished_at"] is not None and len(shown["attempts"]) == 8
    failed = client.get(
        f"/v1/webhooks/endpoints/{endpoint_id}/deliveries",
        params={"status": "failed"},
        headers=admin,
    ).json()
    assert [d["message_id"] for d in failed["deliveries"]] == [msg_id]
    endpoint = client.get(f"/v1/webhooks/endpoints/{endpoint_id}", headers=admin).json()
    assert endpoint["enabled"] is True  # failing for ~28 h: not yet three days

    # Traffic goes on, every six hours, and keeps failing: the first attempt three days
    # after the first failure disables the endpoint.
    failing_since = tried[0][2]
    while clock() - failing_since < timedelta(days=3, hours=12):
        clock.advance(6 * 3600)
        notify(engine, "statement.closed", period=clock().isoformat())
        beat(engine, production, sender, clock)
        if not db.execute("SELECT enabled FROM webhook_endpoints").fetchone()[0]:
            break
    disabled_at = db.execute("SELECT disabled_at FROM webhook_endpoints").fetchone()[0]
    assert disabled_at is not None
    assert timedelta(days=3) <= disabled_at - failing_since < timedelta(days=3, hours=6)
    endpoint = client.get(f"/v1/webhooks/endpoints/{endpoint_id}", headers=admin).json()
    assert endpoint["enabled"] is False
    assert endpoint["disabled_reason"].startswith("every delivery attempt failed for 3")
    assert "days" in endpoint["disabled_reason"]

    arrived = len(receiver.requests)
    notify(engine, "statement.closed", period="after")
    for _ in range(3):
        clock.advance(36000)
        beat(engine, production, sender, clock)
    assert len(receiver.requests) == arrived  # a disabled endpoint is sent nothing
    receiver.stop()
