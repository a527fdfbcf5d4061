"""Settlement's notifications are the transaction's: a rolled-back settlement tells nobody, a
chunk retried run by run tells each run once, parking says "Under review" — and the words
announced always are the words the run page shows."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from freezegun import freeze_time
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from metering.db import raw_transaction
from metering.keys import Principal, Scope
from metering.policy.status import SETTLING, UNDER_REVIEW
from metering.runs import get_run_view
from metering.settlement.runner import claim_due_chunks, settle_chunk
from metering.settlement.settle import settle_runs
from tests.helpers.database import DATA_TABLES
from tests.helpers.events import event, usage
from tests.helpers.ingest import ingest
from tests.helpers.scenarios import scenario

NOW = datetime.now(UTC)
START = NOW - timedelta(hours=1)
READER = Principal("acme", Scope.SUPPORT, "k-test")


def types(db: Any, run: str) -> list[str]:
    rows = db.execute(
        "SELECT type FROM notifications WHERE subject = %s ORDER BY id", (run,)
    ).fetchall()
    return [r[0] for r in rows]


def run_ids(db: Any) -> dict[str, int]:
    return dict(db.execute("SELECT subject, id FROM runs").fetchall())


def test_a_rolled_back_settlement_records_nothing(engine, settings, db):
    ingest(engine, settings, scenario("completed", "r1", "c1", START))
    before = db.execute("SELECT count(*) FROM notifications").fetchone()
    with pytest.raises(RuntimeError), raw_transaction(engine) as conn:
        report = settle_runs(conn, list(run_ids(db).values()), now=NOW, settings=settings)
        assert report.decided  # it decided, recorded …
        raise RuntimeError("… and then the transaction failed")
    assert db.execute("SELECT count(*) FROM notifications").fetchone() == before
    assert db.execute("SELECT announced_status FROM runs").fetchone() == (SETTLING,)
    assert types(db, "r1") == ["run.status_changed"]


def test_a_failed_chunk_retried_run_by_run_tells_each_good_run_once(engine, settings, db):
    for run in ("good-1", "bad", "good-2"):
        ingest(engine, settings, scenario("server-drop", run, "c1", START))
    # The usage lines no longer add up to the run's gross: settling it raises.
    db.execute("UPDATE runs SET gross_micros = gross_micros + 1 WHERE subject = 'bad'")
    report = settle_chunk(engine, settings, list(run_ids(db).values()), NOW)
    assert len(report.decided) == 2
    for run in ("good-1", "good-2"):
        assert types(db, run) == ["run.status_changed", "run.settled", "run.status_changed"]
    assert types(db, "bad") == ["run.status_changed"]


def test_a_parked_run_is_announced_under_review_once(engine, settings, db):
    t = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
    with freeze_time(t + timedelta(seconds=1)):
        ingest(engine, settings, [event(type="run.completed", time=t)])
    lease = settings.claim_lease_s + 1
    for attempt in range(settings.max_settle_attempts + 2):
        with freeze_time(t + timedelta(seconds=120 + attempt * lease)):
            claim_due_chunks(engine, settings)  # claimed, never settled: a failing run
    rows = db.execute(
        "SELECT data->>'previous_status', data->>'status' FROM notifications ORDER BY id"
    ).fetchall()
    assert rows == [(None, SETTLING), (SETTLING, UNDER_REVIEW)]
    assert db.execute("SELECT parked_at IS NOT NULL FROM runs").fetchone() == (True,)


# --- the words announced are the words shown, whatever arrives and whenever it settles ---

STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("run.usage"), st.integers(1, 3)),  # (type, attempt)
        st.tuples(st.just("connection.lost"), st.sampled_from(["server", "client"])),
        st.tuples(st.just("connection.restored"), st.sampled_from(["server", "client"])),
        st.tuples(st.just("run.resumed"), st.integers(2, 3)),
        st.tuples(st.just("run.heartbeat"), st.none()),
        st.tuples(st.just("run.failed"), st.none()),
        st.tuples(st.just("settle"), st.none()),
    ),
    min_size=1,
    max_size=14,
)


def _event(kind: str, arg: Any, minute: int, position: int) -> dict[str, Any]:
    at = START + timedelta(minutes=minute, seconds=position)
    if kind == "run.usage":
        return usage(run="p", step=position, attempt=arg, time=at)
    if kind in ("connection.lost", "connection.restored"):
        return event(type=kind, run="p", side=arg, time=at)
    if kind == "run.resumed":
        return event(type=kind, run="p", attempt=arg, time=at)
    if kind == "run.failed":
        return event(type=kind, run="p", cause="network", time=at)
    return event(type=kind, run="p", time=at)


@hsettings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=STEPS, minutes=st.data())
def test_announced_words_always_are_the_words_the_run_shows(engine, settings, db, steps, minutes):
    with raw_transaction(engine) as conn:
        conn.execute(f"TRUNCATE {', '.join(DATA_TABLES)} RESTART IDENTITY CASCADE")
    for position, (kind, arg) in enumerate(steps):
        if kind == "settle":
            ids = list(run_ids(db).values())
            with raw_transaction(engine) as conn:
                settle_runs(conn, ids, now=NOW, settings=settings, force=True)
        else:
            minute = minutes.draw(st.integers(0, 20))  # events arrive out of order too
            ingest(engine, settings, [_event(kind, arg, minute, position)])
        if not run_ids(db):
            continue
        with raw_transaction(engine) as conn:
            shown = get_run_view(conn, READER, "p").status
        said = db.execute(
            "SELECT data->>'previous_status', data->>'status' FROM notifications "
            "WHERE type = 'run.status_changed' ORDER BY id"
        ).fetchall()
        assert said[-1][1] == shown
        assert [old for old, _ in said] == [None, *(new for _, new in said[:-1])]
        assert all(old != new for old, new in said)
