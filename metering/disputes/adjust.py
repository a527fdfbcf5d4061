"""Pure: support's say applied on top of a policy decision.

Support can grant an extra credit on a run and can release a run held for review (R7/R8).
Both are kept on the run and applied to every later policy decision too, so late evidence
re-decides the run without undoing what support granted.
"""

from __future__ import annotations

from dataclasses import replace

from metering.money import describe_usd
from metering.policy import HELD_FOR_REVIEW, Decision, outcome_for
from metering.policy.status import (
    CANCELLED,
    COMPLETED,
    COMPLETED_CREDITED,
    FAILED_CHARGED,
    FAILED_PARTIAL,
    FAILED_RESTORED,
)


def status_after(policy_status: str, billed: int, credited: int) -> str:
    """The status words once support has changed the amounts."""
    if policy_status in (COMPLETED, COMPLETED_CREDITED, CANCELLED):
        if policy_status == CANCELLED:
            return CANCELLED
        return COMPLETED if credited == 0 else COMPLETED_CREDITED
    if billed == 0:
        return FAILED_RESTORED
    return FAILED_CHARGED if credited == 0 else FAILED_PARTIAL


def apply_support(
    decision: Decision, *, extra_credit_micros: int, released: bool, ended_kind: str
) -> Decision:
    """The decision with support's credit and release applied; unchanged when there is none.

    ``ended_kind`` is the status the policy would show without a hold ("completed", "failed"
    or "cancelled"), needed to word a released hold.
    """
    held = decision.outcome == HELD_FOR_REVIEW
    if extra_credit_micros == 0 and not (held and released):
        return decision
    if held and not released:
        return decision  # support has not decided the hold yet: credits wait with it
    credit = min(extra_credit_micros, decision.billed_micros)
    billed = decision.billed_micros - credit
    credited = decision.credited_micros + credit
    base_status = {"completed": COMPLETED, "cancelled": CANCELLED}.get(ended_kind, FAILED_CHARGED)
    status = status_after(base_status if held else decision.status, billed, credited)
    note = f" Support credited {describe_usd(credit)} USD." if credit else ""
    if held:
        note = " Support reviewed the run." + note
    return replace(
        decision,
        outcome=outcome_for(billed, credited),
        billed_micros=billed,
        credited_micros=credited,
        status=status,
        explanation=decision.explanation + note,
        rule_ids=tuple(sorted({*decision.rule_ids, "S1"})),
    )
