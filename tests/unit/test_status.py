"""Pure live status of an unsettled run (docs/policy.md)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

from metering.policy.status import (
    AGENT_RUNNING,
    CONNECTION_INTERRUPTED,
    RECONNECTING,
    RESUMING,
    SETTLING,
    EventFact,
    live_status,
)

T0 = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
_ids = itertools.count()


def fact(type_: str, minute: int, **data: object) -> EventFact:
    return EventFact(f"e{next(_ids)}", type_, T0 + timedelta(minutes=minute), dict(data))


def test_no_interruption_is_running():
    assert live_status([fact("run.usage", 1, attempt=1)], terminal=False) == AGENT_RUNNING


def test_server_drop_without_restore_is_interrupted():
    events = [fact("run.usage", 1), fact("connection.lost", 2, side="server")]
    assert live_status(events, terminal=False) == CONNECTION_INTERRUPTED


def test_server_restore_clears_the_interruption():
    events = [
        fact("connection.lost", 2, side="server"),
        fact("connection.restored", 3, side="server"),
    ]
    assert live_status(events, terminal=False) == AGENT_RUNNING


def test_client_restore_does_not_clear_a_server_drop():
    events = [
        fact("connection.lost", 2, side="server"),
        fact("connection.restored", 3, side="client"),
    ]
    assert live_status(events, terminal=False) == CONNECTION_INTERRUPTED


def test_client_drop_is_reconnecting():
    assert live_status([fact("connection.lost", 2, side="client")], terminal=False) == RECONNECTING


def test_resume_without_new_usage_is_resuming_then_running_after_usage():
    events = [fact("connection.lost", 2, side="server"), fact("run.resumed", 3, attempt=2)]
    assert live_status(events, terminal=False) == RESUMING
    old_attempt_usage = [*events, fact("run.usage", 4, attempt=1)]
    assert live_status(old_attempt_usage, terminal=False) == RESUMING
    events.append(fact("run.usage", 4, attempt=2))
    assert live_status(events, terminal=False) == AGENT_RUNNING


def test_drop_after_resume_is_interrupted_again():
    events = [
        fact("run.resumed", 3, attempt=2),
        fact("run.usage", 4, attempt=2),
        fact("connection.lost", 5, side="server"),
    ]
    assert live_status(list(reversed(events)), terminal=False) == CONNECTION_INTERRUPTED


def test_ended_run_is_settling():
    assert live_status([fact("run.completed", 1)], terminal=True) == SETTLING
