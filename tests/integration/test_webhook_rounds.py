"""One delivery round at a time: a second round leaves at once without sending (the round
that runs takes what became due), and the round that ran says whether something is due
after it let go of its slot, so its task kicks the next one; a message waiting behind its
run's earlier one, or for its retry, is not "due" (no round kicks itself in a loop)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from metering.db import raw_transaction
from metering.webhooks.delivery import (
    ROUND_LOCK_KEY,
    Attempt,
    claim,
    deliver_in_turn,
    has_due,
    record_delivered,
    round_slot,
)
from metering.webhooks.fanout import fan_out_pending
from reconciler.webhook_sender import WebhookSender
from tests.helpers.events import usage
from tests.helpers.ingest import ingest
from tests.helpers.webhooks import Receiver, add_endpoint, notify, wait_for


def now() -> datetime:
    return datetime.now(UTC)


def test_a_second_round_leaves_at_once_and_the_first_sends(engine, settings, db):
    allowed = settings.model_copy(update={"webhooks_allow_private": True})
    ingest(engine, settings, [usage(run="run-1", customer="cust-1")])
    sender = WebhookSender()
    with Receiver() as receiver:
        _, secret = add_endpoint(engine, settings, receiver.url)
        receiver.secrets = [secret]
        notify(engine, "run.settled", run="run-1")
        fan_out_pending(engine, allowed, now)
        url = str(engine.url.render_as_string(hide_password=False)).replace("+psycopg", "")
        with psycopg.connect(url, autocommit=True) as other_round:
            other_round.execute("SELECT pg_advisory_lock(%s, 0)", (ROUND_LOCK_KEY,))
            left = deliver_in_turn(engine, allowed, sender, now)
            assert (left.ran, left.sent, left.more_due) == (False, 0, False)
            assert receiver.requests == []
            # The other round ends (said here: a closed session lets go only once its
            # server process has noticed, a moment after the client returns).
            other_round.execute("SELECT pg_advisory_unlock(%s, 0)", (ROUND_LOCK_KEY,))
        ran = deliver_in_turn(engine, allowed, sender, now)  # the other round has ended
        assert (ran.ran, ran.sent, ran.more_due) == (True, 1, False)
        wait_for(lambda: len(receiver.processed) == 1, 10)
    sender.close()
    # The slot was let go: nothing of the round's session lingers in the pool.
    locks = db.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s",
        (ROUND_LOCK_KEY,),
    ).fetchone()
    assert locks == (0,)


def test_only_what_a_claim_would_take_is_due(engine, settings, db: Any):
    ingest(engine, settings, [usage(run="run-1", customer="cust-1")])
    add_endpoint(engine, settings, "https://93.184.215.14/a")
    notify(engine, "run.settled", run="run-1")
    notify(engine, "run.resettled", run="run-1")
    fan_out_pending(engine, settings, now)
    with raw_transaction(engine) as conn:
        assert has_due(conn, now())
    # The run's first message waits for its retry: the second waits behind it.
    db.execute(
        "UPDATE webhook_messages SET next_attempt_at = %s WHERE notification_id = "
        "(SELECT min(notification_id) FROM webhook_messages)",
        (now() + timedelta(minutes=5),),
    )
    with raw_transaction(engine) as conn:
        assert not has_due(conn, now())
        assert has_due(conn, now() + timedelta(minutes=6))


def test_delivered_attempts_recorded_together_are_each_recorded_as_alone(engine, settings, db):
    """Delivered, logged and the endpoint's failure streak ended; a message whose lease ran
    out and that another sender claimed again keeps its status (its attempt is logged)."""
    ingest(engine, settings, [usage(run=r, customer="cust-1") for r in ("run-1", "run-2")])
    endpoint, _ = add_endpoint(engine, settings, "https://93.184.215.14/a")
    notify(engine, "run.settled", run="run-1")
    notify(engine, "run.settled", run="run-2")
    fan_out_pending(engine, settings, now)
    db.execute("UPDATE webhook_endpoints SET failing_since = now() - interval '1 hour'")
    at = now()
    with raw_transaction(engine) as conn:
        lost, mine = sorted(claim(conn, at, 10, timedelta(seconds=1)), key=lambda m: m.id)
    with raw_transaction(engine) as conn:  # the lease ran out; another sender has it now
        [again] = claim(conn, at + timedelta(seconds=2), 1, timedelta(seconds=30))
    assert again.id == lost.id
    done = Attempt(at, True, 204, 12, "ok", None)
    with raw_transaction(engine) as conn:
        assert record_delivered(conn, [(lost, done), (mine, done)]) == 1
    rows = db.execute(
        "SELECT m.id, m.status, m.claimed_until IS NULL, a.attempt, a.outcome, a.status_code, "
        "a.latency_ms, a.response_excerpt FROM webhook_messages m "
        "JOIN webhook_attempts a ON a.message_id = m.id ORDER BY m.id"
    ).fetchall()
    assert rows == [
        (lost.id, "pending", False, 1, "delivered", 204, 12, "ok"),
        (mine.id, "delivered", True, 1, "delivered", 204, 12, "ok"),
    ]
    streak = db.execute("SELECT failing_since FROM webhook_endpoints WHERE id = %s", (endpoint,))
    assert streak.fetchone() == (None,)


def test_a_round_that_fails_lets_go_of_its_slot(engine, settings, db):
    """Its connection is dropped, not pooled with the lock still held: the next round runs
    (once the server has noticed the closed session, a moment later)."""
    with pytest.raises(RuntimeError), round_slot(engine, 1) as ran:
        assert ran
        raise RuntimeError("the round failed")

    def free() -> bool:
        with round_slot(engine, 1) as ran:
            return ran

    wait_for(free, 10)
    with round_slot(engine, 2) as first, round_slot(engine, 2) as second:
        assert (first, second) == (True, True)  # two slots, two rounds
        with round_slot(engine, 2) as third:
            assert not third
