"""``decide``: the settlement policy v1 (docs/policy.md) as one pure function."""

from __future__ import annotations

from metering.policy.cap import CapBreach, cap_breach
from metering.policy.duplicates import RuleHit, line_rules
from metering.policy.ending import Ending, EndingRuling, Verdict, rule_on_ending
from metering.policy.explain import Amounts, explain, explain_parts
from metering.policy.facts import (
    BUILT_IN_POLICY,
    CONFIRMED,
    HELD_FOR_REVIEW,
    PARTIALLY_CREDITED,
    REFUNDED,
    Decision,
    PolicyConfig,
    RunFacts,
)
from metering.policy.status import (
    CANCELLED,
    COMPLETED,
    COMPLETED_CREDITED,
    FAILED_CHARGED,
    FAILED_PARTIAL,
    FAILED_RESTORED,
    UNDER_REVIEW,
)
from metering.policy.timeline import Timeline, build_timeline

DEFAULT_CONFIG = BUILT_IN_POLICY


def outcome_for(billed_micros: int, credited_micros: int) -> str:
    """docs/policy.md: the outcome follows the amounts (a run with no usage is confirmed)."""
    if credited_micros == 0:
        return CONFIRMED
    if billed_micros == 0:
        return REFUNDED
    return PARTIALLY_CREDITED


def status_for(ending: Ending, outcome: str, billed_micros: int, credited_micros: int) -> str:
    """The docs/policy.md status word of the settled run."""
    if outcome == HELD_FOR_REVIEW:
        return UNDER_REVIEW
    if ending is Ending.COMPLETED:
        return COMPLETED if credited_micros == 0 else COMPLETED_CREDITED
    if ending is Ending.USER_CANCELLED:
        return CANCELLED
    # Failed or abandoned: the words follow the amounts. Nothing billed (including a run
    # with no usage at all) reads "usage restored"; nothing credited reads "charged".
    if billed_micros == 0:
        return FAILED_RESTORED
    if credited_micros == 0:
        return FAILED_CHARGED
    return FAILED_PARTIAL


def _sum(timeline: Timeline, line_ids: frozenset[int]) -> int:
    return sum(line.gross_micros for line in timeline.lines if line.line_id in line_ids)


def _decision(
    timeline: Timeline,
    hits: tuple[RuleHit, ...],
    ruling: EndingRuling,
    credited_ids: frozenset[int],
    breach: CapBreach | None,
    automatic: Amounts,
    explained: bool,
) -> Decision:
    held = ruling.verdict is Verdict.HOLD or breach is not None
    if held:
        # Provisional amounts of a held run: only R1–R3 credits, which hold in any outcome.
        credited_ids = frozenset().union(*(hit.line_ids for hit in hits))
    credited = _sum(timeline, credited_ids)
    billed = automatic.gross_micros - credited
    outcome = HELD_FOR_REVIEW if held else outcome_for(billed, credited)
    rules = {hit.rule_id for hit in hits} | ruling.rule_ids | ({"R8"} if breach else set())
    if len(rules) > 1:
        rules.discard("R0")  # R0 is "anything else"
    evidence = ruling.evidence_ids.union(*(hit.evidence_ids for hit in hits))
    story, closing = ("", "")
    if explained:
        story, closing = explain_parts(timeline, hits, ruling, automatic, breach)
    return Decision(
        outcome=outcome,
        gross_micros=automatic.gross_micros,
        billed_micros=billed,
        credited_micros=credited,
        credited_line_ids=tuple(sorted(credited_ids)),
        rule_ids=tuple(sorted(rules)),
        evidence_event_ids=tuple(sorted(evidence)),
        explanation=" ".join(p for p in (story, closing) if p),
        status=status_for(ruling.ending, outcome, billed, credited),
        story=story,
    )


def _no_usage(timeline: Timeline, ruling: EndingRuling, explained: bool) -> Decision:
    # Nothing to bill, credit or review, whatever the ending: confirmed under R0.
    return Decision(
        outcome=CONFIRMED,
        gross_micros=0,
        billed_micros=0,
        credited_micros=0,
        credited_line_ids=(),
        rule_ids=("R0",),
        evidence_event_ids=tuple(sorted(ruling.evidence_ids)),
        explanation=explain(timeline, (), ruling, Amounts(0, 0, 0), None) if explained else "",
        status=status_for(ruling.ending, CONFIRMED, 0, 0),
    )


def decide(
    facts: RunFacts, config: PolicyConfig = DEFAULT_CONFIG, *, explained: bool = True
) -> Decision:
    """Settle one run by the rules of docs/policy.md.

    Pure and deterministic: the same set of events and usage lines, in any order and with
    any duplicates, gives an identical Decision (explanation included). R1–R3 name lines
    credited in any outcome; R4/R5 (failed or abandoned with a verified interruption in
    force at the end) name more; the decision credits their union and bills the rest.
    R7 (unverified failure or abandonment) and R8 (protection cap) hold the run for review
    instead; a held decision's amounts are provisional (see ``Decision``). ``config`` is
    the tenant's policy in force: its switches turn rules off (see ``PolicyConfig``). A run with no
    usage is confirmed with nothing billed. ``evidence_event_ids`` are the events the fired
    rules rest on, plus the terminal event when there is one.

    ``explained=False`` leaves ``explanation`` and ``story`` empty and changes nothing else:
    a what-if compares the amounts of a whole period under a candidate and reads no words,
    which are a sixth of the cost of a decision.

    Raises ValueError for facts no settled run can have: no terminal event while not
    ``abandoned``, or a negative usage amount.
    """
    timeline = build_timeline(facts)
    ruling = rule_on_ending(timeline, config)
    if timeline.gross_micros == 0:
        return _no_usage(timeline, ruling, explained)
    hits = line_rules(timeline, config)
    gross = timeline.gross_micros
    credited_ids = ruling.line_ids.union(*(hit.line_ids for hit in hits))
    credited = _sum(timeline, credited_ids)
    breach = None
    if ruling.verdict is not Verdict.HOLD and config.r8:
        breach = cap_breach(
            facts.period, config, credit_micros=credited, full_refund=credited == gross
        )
    automatic = Amounts(gross, gross - credited, credited)
    return _decision(timeline, hits, ruling, credited_ids, breach, automatic, explained)
