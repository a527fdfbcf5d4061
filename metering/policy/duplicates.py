"""R1–R3: usage lines credited whatever the run's outcome (duplicate or lost work)."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

import msgspec

from metering.policy.facts import BUILT_IN_POLICY, EventFact, PolicyConfig, UsageLine
from metering.policy.timeline import Timeline, event_key, is_verified_interruption


class RuleHit(msgspec.Struct, frozen=True):
    """A rule that named usage lines to credit, with the events that show why."""

    rule_id: str
    line_ids: frozenset[int]
    evidence_ids: frozenset[str]
    anchor: EventFact | None = None  # the event the explanation names (resume, drop)
    checkpoint_step: int | None = None  # R3: the saved step the anchor's work fell back to


def replayed_context(timeline: Timeline) -> RuleHit | None:
    """R2: ``replay=true`` usage in a resumed attempt (attempt > 1, or at/after a resume)."""
    resumes = timeline.of_type("run.resumed")
    line_ids: set[int] = set()
    evidence: set[str] = set()
    anchor: EventFact | None = None  # the resume before the first credited replay
    for line in timeline.lines:
        if not line.replay:
            continue  # most lines: no need to look for the resumes before them
        before = [r for r in resumes if r.time <= line.time]
        if line.attempt == 1 and not before:
            continue
        resume = max(before, key=event_key, default=None)
        if not line_ids:
            anchor = resume
        line_ids.add(line.line_id)
        evidence.add(line.event_id)
        if resume is not None:
            evidence.add(resume.event_id)
    if not line_ids:
        return None
    return RuleHit("R2", frozenset(line_ids), frozenset(evidence), anchor=anchor)


def _saved_step(timeline: Timeline, at: datetime) -> tuple[int | None, EventFact | None]:
    checkpoints = [c for c in timeline.of_type("run.checkpoint") if c.time <= at]
    if not checkpoints:
        return None, None
    last = max(checkpoints, key=lambda c: (c.time, int(c.data["step"]), c.event_id))
    return int(last.data["step"]), last


def _redone(line: UsageLine, after: datetime, lines: tuple[UsageLine, ...]) -> bool:
    # Replayed calls only rebuild context; re-execution is a real call of a later attempt.
    return any(
        not other.replay
        and other.step == line.step
        and other.attempt > line.attempt
        and other.time > after
        for other in lines
    )


def lost_work(timeline: Timeline) -> RuleHit | None:
    """R3: the interrupted attempt's copy of steps after the last checkpoint before a
    verified interruption, when a later attempt executed the same step again.

    "Last checkpoint" is the latest ``run.checkpoint`` at or before the interruption (none:
    all earlier work was lost). Lines at or before the interruption count as interrupted.
    """
    line_ids: set[int] = set()
    evidence: set[str] = set()
    anchor: EventFact | None = None
    anchor_step: int | None = None
    for interruption in filter(is_verified_interruption, timeline.events):
        saved, checkpoint = _saved_step(timeline, interruption.time)
        lost = [
            line
            for line in timeline.lines
            if line.time <= interruption.time
            and (saved is None or line.step > saved)
            and _redone(line, interruption.time, timeline.lines)
        ]
        if not lost:
            continue
        if anchor is None:
            anchor, anchor_step = interruption, saved
        line_ids.update(line.line_id for line in lost)
        evidence.update(line.event_id for line in lost)
        evidence.add(interruption.event_id)
        if checkpoint is not None:
            evidence.add(checkpoint.event_id)
    if not line_ids:
        return None
    return RuleHit("R3", frozenset(line_ids), frozenset(evidence), anchor, anchor_step)


def duplicate_tool_calls(timeline: Timeline, already: frozenset[int]) -> RuleHit | None:
    """R1: usage re-running a tool call that had already completed earlier in the run.

    Per ``tool_call_id``, in (time, line_id) order: a line is credited when a
    ``run.tool_call`` with ``status=completed`` for that id is strictly earlier than the line,
    AND an earlier line with that id is paid for, i.e. not credited by R2/R3 (``already``).
    So the first paid execution of a tool call is always billed, and a step whose first copy
    was lost work (R3) is billed once, not credited twice.
    """
    completed_at: dict[str, EventFact] = {}
    for event in timeline.of_type("run.tool_call"):
        if event.data.get("status") == "completed":
            tool_call_id = str(event.data["tool_call_id"])
            completed_at.setdefault(tool_call_id, event)  # events are in time order
    by_tool_call: dict[str, list[UsageLine]] = defaultdict(list)
    for line in timeline.lines:
        if line.tool_call_id is not None:
            by_tool_call[line.tool_call_id].append(line)
    line_ids: set[int] = set()
    evidence: set[str] = set()
    for tool_call_id, lines in by_tool_call.items():
        completion = completed_at.get(tool_call_id)
        if completion is None:
            continue
        paid_before = False
        for line in lines:
            if paid_before and completion.time < line.time:
                line_ids.add(line.line_id)
                evidence.update((line.event_id, completion.event_id))
            elif line.line_id not in already:
                paid_before = True
    if not line_ids:
        return None
    return RuleHit("R1", frozenset(line_ids), frozenset(evidence))


def line_rules(timeline: Timeline, config: PolicyConfig = BUILT_IN_POLICY) -> tuple[RuleHit, ...]:
    """The R1–R3 hits, in rule order (only rules that are on and named at least one line).

    A switched-off R2 or R3 credits nothing, so for R1 those lines are paid for.
    """
    r2 = replayed_context(timeline) if config.r2 else None
    r3 = lost_work(timeline) if config.r3 else None
    already = frozenset().union(*(hit.line_ids for hit in (r2, r3) if hit is not None))
    r1 = duplicate_tool_calls(timeline, already) if config.r1 else None
    return tuple(hit for hit in (r1, r2, r3) if hit is not None)
