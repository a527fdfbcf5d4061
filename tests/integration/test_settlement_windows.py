"""When runs become due (docs/policy.md), at the boundary seconds, with a frozen clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from freezegun import freeze_time
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from metering.db import raw_transaction
from metering.settlement.due import IS_DUE_SQL, RunClock, Windows, cutoff_params, due_at
from metering.settlement.runner import claim_due_chunks
from tests.helpers.events import event, usage
from tests.helpers.ingest import ingest

T = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)


def claimed_after(engine: Any, settings: Any, seconds: float) -> bool:
    with freeze_time(T + timedelta(seconds=seconds)):
        return bool(claim_due_chunks(engine, settings))


@pytest.fixture
def at_t(engine, settings, db):
    """Ingest events as if it were T + 1 s."""

    def send(*events: dict[str, Any]) -> None:
        with freeze_time(T + timedelta(seconds=1)):
            ingest(engine, settings, list(events))

    return send


def test_terminal_run_is_due_exactly_at_settle_grace(engine, settings, at_t):
    at_t(usage(step=1, time=T - timedelta(minutes=5)), event(type="run.completed", time=T))
    assert not claimed_after(engine, settings, 119)
    assert claimed_after(engine, settings, 120)


def test_open_drop_is_due_exactly_at_resume_window(engine, settings, at_t):
    at_t(
        usage(step=1, time=T - timedelta(minutes=1)),
        event(type="connection.lost", side="server", time=T),
    )
    assert not claimed_after(engine, settings, 899)
    assert claimed_after(engine, settings, 900)


def test_resumed_drop_waits_for_the_idle_timeout(engine, settings, at_t):
    at_t(
        event(type="connection.lost", side="server", time=T - timedelta(seconds=60)),
        event(type="run.resumed", attempt=2, time=T),
    )
    assert not claimed_after(engine, settings, 900)
    assert not claimed_after(engine, settings, 3599)
    assert claimed_after(engine, settings, 3600)


def test_silent_run_is_due_exactly_at_idle_timeout(engine, settings, at_t):
    at_t(usage(step=1, time=T))
    assert not claimed_after(engine, settings, 3599)
    assert claimed_after(engine, settings, 3600)


def test_claimed_run_is_not_claimed_again_until_its_lease_expires(engine, settings, at_t):
    at_t(event(type="run.completed", time=T))
    assert claimed_after(engine, settings, 120)
    assert not claimed_after(engine, settings, 121)
    assert claimed_after(engine, settings, 120 + settings.claim_lease_s + 1)


def test_run_that_keeps_failing_is_parked(engine, settings, db, at_t):
    at_t(event(type="run.completed", time=T))
    lease = settings.claim_lease_s + 1
    for attempt in range(settings.max_settle_attempts):
        assert claimed_after(engine, settings, 120 + attempt * lease)
    assert not claimed_after(engine, settings, 120 + settings.max_settle_attempts * lease)
    parked, reason = db.execute("SELECT parked_at, parked_reason FROM runs").fetchone()
    assert parked is not None and "5 times" in reason


optional_offset = st.none() | st.integers(-7200, 7200)


@hsettings(max_examples=80, deadline=None)
@given(
    terminal=optional_offset,
    lost=optional_offset,
    recovered=optional_offset,
    last=st.integers(-7200, 7200),
    now=st.integers(-3600, 10800),
)
def test_sql_and_python_agree_on_whether_a_run_is_due(
    engine, settings, terminal, lost, recovered, last, now
):
    def moment(offset: int | None) -> datetime | None:
        return None if offset is None else T + timedelta(seconds=offset)

    clock = RunClock(moment(terminal), T + timedelta(seconds=last), moment(lost), moment(recovered))
    windows = Windows.from_settings(settings)
    at = T + timedelta(seconds=now)
    sql = IS_DUE_SQL.replace("runs.", "")
    with raw_transaction(engine) as conn:
        (from_sql,) = conn.execute(
            f"SELECT coalesce({sql}, false) "
            "FROM (SELECT %(terminal_at)s::timestamptz AS terminal_at, "
            "%(last_event_at)s::timestamptz AS last_event_at, "
            "%(last_lost_at)s::timestamptz AS last_lost_at, "
            "%(last_recovered_at)s::timestamptz AS last_recovered_at) AS r",
            {
                "terminal_at": clock.terminal_at,
                "last_event_at": clock.last_event_at,
                "last_lost_at": clock.last_lost_at,
                "last_recovered_at": clock.last_recovered_at,
                **cutoff_params(windows, at),
            },
        ).fetchone()
    assert from_sql == (due_at(clock, windows) <= at)
