"""R4–R7 and R0: what the way a run ended means for its bill."""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

import msgspec

from metering.policy.facts import BUILT_IN_POLICY, EventFact, PolicyConfig
from metering.policy.timeline import Timeline, ending_event, event_key, is_client_evidence


class Ending(StrEnum):
    COMPLETED = "completed"
    USER_CANCELLED = "user_cancelled"
    FAILED = "failed"  # run.failed, or run.cancelled by=system (a server failure, R6)
    ABANDONED = "abandoned"  # settled without a terminal event


class Verdict(StrEnum):
    BILL = "bill"  # R0, R6, a failure whose cause is not protected (tool), or R4/R5 off
    REFUND = "refund"  # R4, or R7 auto-refunding a small run when the policy says so
    PARTIAL = "partial"  # R5
    HOLD = "hold"  # R7


class EndingRuling(msgspec.Struct, frozen=True):
    ending: Ending
    verdict: Verdict
    rule_ids: frozenset[str]
    line_ids: frozenset[int]  # R4/R5: the lines to credit
    evidence_ids: frozenset[str]
    interruption: EventFact | None = None  # R4/R5: the earliest verified interruption
    delivery: EventFact | None = None  # R5: the delivery reaching furthest
    client_evidence: EventFact | None = None  # R7: the latest client-side claim
    # R4/R5 switched off: the interruption the policy chose not to protect (words only).
    unprotected: EventFact | None = None
    auto_refund_under_micros: int | None = None  # R7 refunding instead of holding


def ending_of(timeline: Timeline) -> Ending:
    return _ending(timeline.terminal)


def ending_of_events(events: Iterable[EventFact]) -> Ending:
    """How a run with these events ended (``ABANDONED`` without a terminal event)."""
    return _ending(ending_event(events))


def _ending(terminal: EventFact | None) -> Ending:
    if terminal is None:
        return Ending.ABANDONED
    if terminal.type == "run.completed":
        return Ending.COMPLETED
    if terminal.type == "run.cancelled" and terminal.data.get("by") == "user":
        return Ending.USER_CANCELLED
    return Ending.FAILED


def _ids(*events: EventFact | None) -> frozenset[str]:
    return frozenset(e.event_id for e in events if e is not None)


def _protected(
    timeline: Timeline, ending: Ending, in_force: tuple[EventFact, ...], config: PolicyConfig
) -> EndingRuling:
    evidence = _ids(timeline.terminal, *in_force)
    delivery = timeline.last_delivery()
    if not (config.r5 if delivery is not None else config.r4):
        # The rule is off: billed as R0, citing only the terminal event, not the drop.
        return EndingRuling(
            ending,
            Verdict.BILL,
            frozenset({"R0"}),
            frozenset(),
            _ids(timeline.terminal),
            unprotected=in_force[0],
        )
    if delivery is None:
        all_lines = frozenset(line.line_id for line in timeline.lines)
        return EndingRuling(
            ending, Verdict.REFUND, _rules("R4", timeline), all_lines, evidence, in_force[0]
        )
    delivered_step = int(delivery.data["step"])
    undelivered = frozenset(line.line_id for line in timeline.lines if line.step > delivered_step)
    return EndingRuling(
        ending,
        Verdict.PARTIAL,
        _rules("R5", timeline),
        undelivered,
        evidence | _ids(delivery),
        interruption=in_force[0],
        delivery=delivery,
    )


def _rules(rule_id: str, timeline: Timeline) -> frozenset[str]:
    # A system cancel reaches R4/R5 through R6, so both are named.
    terminal = timeline.terminal
    cancelled = terminal is not None and terminal.type == "run.cancelled"
    return frozenset({rule_id, "R6"} if cancelled else {rule_id})


def rule_on_ending(timeline: Timeline, config: PolicyConfig = BUILT_IN_POLICY) -> EndingRuling:
    """Apply R0, R4, R5, R6 and R7 to the way the run ended.

    R4/R5 need a verified interruption the run ended in (``interruptions_in_force``): a
    server-side drop that was restored or resumed is not why a later failure happened.
    A failure with cause ``tool`` and no such interruption is billed (not protected); any
    other failure or abandonment without one is held for review (R7).
    """
    ending = ending_of(timeline)
    no_lines: frozenset[int] = frozenset()
    if ending is Ending.COMPLETED:
        return EndingRuling(
            ending, Verdict.BILL, frozenset({"R0"}), no_lines, _ids(timeline.terminal)
        )
    if ending is Ending.USER_CANCELLED:
        return EndingRuling(
            ending, Verdict.BILL, frozenset({"R6"}), no_lines, _ids(timeline.terminal)
        )
    in_force = timeline.interruptions_in_force()
    if in_force:
        return _protected(timeline, ending, in_force, config)
    terminal = timeline.terminal
    if terminal is not None and terminal.data.get("cause") == "tool":
        return EndingRuling(ending, Verdict.BILL, frozenset({"R0"}), no_lines, _ids(terminal))
    end = timeline.ended_at
    claims = [
        e for e in timeline.events if is_client_evidence(e) and (end is None or e.time <= end)
    ]
    claim = max(claims, key=event_key, default=None)
    under = config.r7_auto_refund_under_micros
    if under is not None and timeline.gross_micros < under:
        return EndingRuling(
            ending,
            Verdict.REFUND,
            frozenset({"R7"}),
            frozenset(line.line_id for line in timeline.lines),
            _ids(terminal, *claims),
            client_evidence=claim,
            auto_refund_under_micros=under,
        )
    return EndingRuling(
        ending,
        Verdict.HOLD,
        frozenset({"R7"}),
        no_lines,
        _ids(terminal, *claims),
        client_evidence=claim,
    )
