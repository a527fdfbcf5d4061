"""Keyword-only builders for settlement-policy facts, with readable defaults."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from metering.catalogue import TERMINAL_TYPES
from metering.policy import CustomerPeriod, EventFact, RunFacts, UsageLine

DAY = datetime(2025, 3, 3, tzinfo=UTC)
ROOMY = CustomerPeriod(period_gross_micros=10**12)  # a period where the cap never binds

_event_ids = itertools.count(1)
_line_ids = itertools.count(1)


def at(hour: int, minute: int = 0, second: int = 0) -> datetime:
    """A time on the test day, in UTC."""
    return DAY.replace(hour=hour, minute=minute, second=second)


def event(type: str, *, at: datetime, id: str | None = None, **data: Any) -> EventFact:
    return EventFact(event_id=id or f"e{next(_event_ids)}", type=type, time=at, data=data)


def started(*, at: datetime, attempt: int = 1, id: str | None = None) -> EventFact:
    return event("run.started", at=at, id=id, attempt=attempt)


def checkpoint(*, step: int, at: datetime, id: str | None = None) -> EventFact:
    return event("run.checkpoint", at=at, id=id, checkpoint_id=f"cp-{step}", step=step)


def delivered(
    *, step: int, at: datetime, kind: str = "partial", id: str | None = None
) -> EventFact:
    return event("run.delivered", at=at, id=id, step=step, kind=kind)


def tool_call(
    *, tool_call_id: str, step: int, at: datetime, status: str = "completed", id: str | None = None
) -> EventFact:
    return event("run.tool_call", at=at, id=id, tool_call_id=tool_call_id, step=step, status=status)


def lost(*, side: str, at: datetime, id: str | None = None) -> EventFact:
    return event("connection.lost", at=at, id=id, side=side, reason="test")


def restored(*, side: str, at: datetime, id: str | None = None) -> EventFact:
    return event("connection.restored", at=at, id=id, side=side)


def resumed(
    *, attempt: int, at: datetime, from_checkpoint: str | None = None, id: str | None = None
) -> EventFact:
    data: dict[str, Any] = {"attempt": attempt}
    if from_checkpoint is not None:
        data["from_checkpoint"] = from_checkpoint
    return event("run.resumed", at=at, id=id, **data)


def heartbeat(*, at: datetime, id: str | None = None) -> EventFact:
    return event("run.heartbeat", at=at, id=id)


def completed(*, at: datetime, id: str | None = None) -> EventFact:
    return event("run.completed", at=at, id=id)


def cancelled(*, by: str, at: datetime, id: str | None = None) -> EventFact:
    return event("run.cancelled", at=at, id=id, by=by)


def failed(*, cause: str, at: datetime, id: str | None = None) -> EventFact:
    return event("run.failed", at=at, id=id, cause=cause)


def line(
    *,
    step: int,
    micros: int,
    at: datetime,
    attempt: int = 1,
    tool_call_id: str | None = None,
    replay: bool = False,
    line_id: int | None = None,
    event_id: str | None = None,
) -> UsageLine:
    """A priced usage line; ``micros`` is its gross."""
    number = line_id if line_id is not None else next(_line_ids)
    return UsageLine(
        line_id=number,
        event_id=event_id or f"u{number}",
        step=step,
        attempt=attempt,
        tool_call_id=tool_call_id,
        replay=replay,
        gross_micros=micros,
        time=at,
    )


def period(
    *, gross_micros: int = 10**12, credited_micros: int = 0, refunded_runs: int = 0
) -> CustomerPeriod:
    return CustomerPeriod(
        period_gross_micros=gross_micros,
        auto_credited_micros=credited_micros,
        auto_refunded_runs=refunded_runs,
    )


def run(
    *,
    events: Iterable[EventFact] = (),
    usage: Iterable[UsageLine] = (),
    abandoned: bool | None = None,
    period: CustomerPeriod = ROOMY,
) -> RunFacts:
    """Run facts; ``abandoned`` defaults to "there is no terminal event"."""
    events = tuple(events)
    if abandoned is None:
        abandoned = not any(e.type in TERMINAL_TYPES for e in events)
    return RunFacts(events=events, usage=tuple(usage), abandoned=abandoned, period=period)
