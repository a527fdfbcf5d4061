"""The facts of a run made canonical: deduplicated, in UTC, in one total order.

Every later step reads this view only, so the decision cannot depend on the order or the
repetition of the input.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from operator import attrgetter
from typing import Any, Final

import msgspec

from metering.catalogue import TERMINAL_TYPES
from metering.policy.facts import EventFact, RunFacts, UsageLine

SERVER_FAILURE_CAUSES: Final = frozenset({"network", "server", "provider"})


def utc(moment: datetime) -> datetime:
    # Stored times are timezone-aware; a naive one can only have meant UTC.
    if moment.tzinfo is UTC:
        return moment
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


# The total orders of events, (time, type, id), and of usage lines, (time, line id); as
# attrgetters, which build the key in C (sorting is a good part of deciding a run).
event_key: Callable[[EventFact], tuple[datetime, str, str]] = attrgetter("time", "type", "event_id")
line_key: Callable[[UsageLine], tuple[datetime, int]] = attrgetter("time", "line_id")


def _content_key(event: EventFact) -> tuple[datetime, str, str]:
    return (event.time, event.type, json.dumps(event.data, sort_keys=True, default=str))


def _line_content_key(line: UsageLine) -> tuple[object, ...]:
    return (
        line.time,
        line.event_id,
        line.step,
        line.attempt,
        line.tool_call_id or "",
        line.replay,
        line.gross_micros,
    )


def _plain(facts: tuple[EventFact, ...] | tuple[UsageLine, ...], ids: set[Any]) -> bool:
    """No repeated id and every time in UTC (facts read from the database): nothing to
    choose or rebuild, only to sort. The common case, checked in two C-speed passes."""
    return len(ids) == len(facts) and all(f.time.tzinfo is UTC for f in facts)


def _dedupe_events(events: tuple[EventFact, ...]) -> tuple[EventFact, ...]:
    # Two different bodies under one id cannot both be true (ingest refuses that with a 409);
    # keeping the smallest by content still makes the choice independent of input order.
    if _plain(events, {e.event_id for e in events}):
        return tuple(sorted(events, key=event_key))
    chosen: dict[str, EventFact] = {}
    for raw in events:
        # Only a time not in UTC needs a rebuilt fact (``datetime.UTC`` is the one tzinfo
        # that needs no conversion; naive and other zones, zero offset or not, are rebuilt).
        event = raw if raw.time.tzinfo is UTC else msgspec.structs.replace(raw, time=utc(raw.time))
        kept = chosen.get(event.event_id)
        if kept is None or _content_key(event) < _content_key(kept):
            chosen[event.event_id] = event
    return tuple(sorted(chosen.values(), key=event_key))


def _dedupe_lines(lines: tuple[UsageLine, ...]) -> tuple[UsageLine, ...]:
    # As for events, a fact already in UTC is kept as it is: settlement's database sessions
    # run in TimeZone=UTC, and rebuilding every line (``replace`` plus its checks) was about
    # a third of ``decide()``.
    if _plain(lines, {line.line_id for line in lines}):
        return tuple(sorted(lines, key=line_key))
    chosen: dict[int, UsageLine] = {}
    for raw in lines:
        line = raw if raw.time.tzinfo is UTC else msgspec.structs.replace(raw, time=utc(raw.time))
        kept = chosen.get(line.line_id)
        if kept is None or _line_content_key(line) < _line_content_key(kept):
            chosen[line.line_id] = line
    return tuple(sorted(chosen.values(), key=line_key))


def is_server_failure(event: EventFact) -> bool:
    """A terminal event that our side reports as its own failure (R4, R6 by=system)."""
    if event.type == "run.failed":
        return event.data.get("cause") in SERVER_FAILURE_CAUSES
    return event.type == "run.cancelled" and event.data.get("by") != "user"


def is_verified_interruption(event: EventFact) -> bool:
    if event.type == "connection.lost":
        return event.data.get("side") == "server"
    return is_server_failure(event)


def is_client_evidence(event: EventFact) -> bool:
    if event.type == "connection.lost":
        return event.data.get("side") == "client"
    return event.type == "run.failed" and event.data.get("cause") == "client"


class Timeline(msgspec.Struct, frozen=True):
    events: tuple[EventFact, ...]  # sorted by (time, type, event_id)
    lines: tuple[UsageLine, ...]  # sorted by (time, line_id)
    terminal: EventFact | None
    by_type: dict[str, tuple[EventFact, ...]]  # ``events`` of each type, in that order
    gross_micros: int  # of ``lines``

    @property
    def ended_at(self) -> datetime | None:
        """The terminal event's time, else the last thing the run reported."""
        if self.terminal is not None:
            return self.terminal.time
        times = [e.time for e in self.events] + [line.time for line in self.lines]
        return max(times, default=None)

    def of_type(self, type_: str) -> tuple[EventFact, ...]:
        return self.by_type.get(type_, ())

    def interruptions_in_force(self) -> tuple[EventFact, ...]:
        """Verified interruptions the run ended in (what R4/R5 protect against).

        A server-side failure as the terminal event, or a server-side ``connection.lost``
        at or before the end that no server-side ``connection.restored`` or ``run.resumed``
        followed (one at the same instant counts as following it).
        """
        end = self.ended_at
        in_force: list[EventFact] = []
        if self.terminal is not None and is_server_failure(self.terminal):
            in_force.append(self.terminal)
        closers = [
            e.time
            for e in self.events
            if e.type == "run.resumed"
            or (e.type == "connection.restored" and e.data.get("side") == "server")
        ]
        for event in self.of_type("connection.lost"):
            if not is_verified_interruption(event) or (end is not None and event.time > end):
                continue
            if not any(closed_at >= event.time for closed_at in closers):
                in_force.append(event)
        return tuple(sorted(in_force, key=event_key))

    def last_delivery(self) -> EventFact | None:
        """The delivery reaching furthest (highest step; earliest of equals)."""
        deliveries = self.of_type("run.delivered")
        if not deliveries:
            return None
        return min(deliveries, key=lambda e: (-int(e.data["step"]), *event_key(e)))


def ending_event(events: Iterable[EventFact]) -> EventFact | None:
    """The terminal event that ended the run; ``None`` while it has none (or abandoned).

    The one definition of how a run ends: policy, settlement, support's wording, the
    console and the simulator all ask this. Several terminal events (e.g. failed, then a late
    completed from another source): the first one ended the run, and what came after cannot
    un-fail it. At one instant the total order of ``event_key`` decides (type name, then
    id), so a user's ``run.cancelled`` at the moment of a ``run.completed`` is the ending.
    """
    terminals = (e for e in events if e.type in TERMINAL_TYPES)
    return min(terminals, key=event_key, default=None)


def build_timeline(facts: RunFacts) -> Timeline:
    """Canonical view of ``facts``; a run without a terminal event must be ``abandoned``."""
    events = _dedupe_events(facts.events)
    terminal = ending_event(events)
    if terminal is None and not facts.abandoned:
        raise ValueError("a run without a terminal event can only be settled as abandoned")
    lines = _dedupe_lines(facts.usage)
    by_type: dict[str, list[EventFact]] = {}
    for event in events:
        by_type.setdefault(event.type, []).append(event)
    return Timeline(
        events=events,
        lines=lines,
        terminal=terminal,
        by_type={type_: tuple(of_type) for type_, of_type in by_type.items()},
        gross_micros=sum(line.gross_micros for line in lines),
    )
