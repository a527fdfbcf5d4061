"""Pure: support's say applied on top of a policy decision.

Support can grant credits on a run and can release a run held for review (R7/R8). Both
are kept and applied to every later policy decision too, so late evidence re-decides the
run without undoing what support granted. A credit is of the usage the run had when it was
granted: it never reaches usage that arrived later, which the policy alone settles.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import msgspec

from metering.policy import HELD_FOR_REVIEW, Decision, UsageLine, outcome_for
from metering.policy.ending import Ending
from metering.policy.explain import Amounts, after_support
from metering.policy.status import (
    CANCELLED,
    COMPLETED,
    COMPLETED_CREDITED,
    COMPLETED_SUPPORT_CREDITED,
    FAILED_CHARGED,
    FAILED_PARTIAL,
    FAILED_RESTORED,
)


class SupportGrant(msgspec.Struct, frozen=True):
    """A credit support granted: an amount of the run's usage lines up to ``covers_line_id``
    (the run's highest line id when it was granted)."""

    amount_micros: int
    covers_line_id: int


def covered_credit_micros(
    grants: Sequence[SupportGrant],
    usage: Iterable[UsageLine],
    policy_credited_line_ids: Iterable[int],
) -> int:
    """What support's grants take off a decision: each grant at most its amount, and only
    of what the policy still bills of the lines it covers.

    Grants are applied narrowest cover first; each one's room is what its lines bill less
    what the narrower grants (whose lines are among its own) already took. So when late
    evidence makes the policy credit a line support had credited, the support credit
    shrinks rather than spilling onto later usage, and the result never exceeds the
    decision's billed amount.
    """
    gross_by_line = {line.line_id: line.gross_micros for line in usage}  # duplicates collapse
    credited = set(policy_credited_line_ids)
    billed_lines = [(i, gross) for i, gross in gross_by_line.items() if i not in credited]
    applied = 0
    for grant in sorted(grants, key=lambda g: g.covers_line_id):
        billed_covered = sum(
            gross for line_id, gross in billed_lines if line_id <= grant.covers_line_id
        )
        applied += max(0, min(grant.amount_micros, billed_covered - applied))
    return applied


def status_after(policy_status: str, billed: int, credited: int, support_credit: int) -> str:
    """The status words once support has changed the amounts: a completed run support
    credited says so, not the policy's words for duplicate work (R1–R3)."""
    if policy_status in (COMPLETED, COMPLETED_CREDITED, CANCELLED):
        if policy_status == CANCELLED:
            return CANCELLED
        if support_credit > 0:
            return COMPLETED_SUPPORT_CREDITED
        return COMPLETED if credited == 0 else COMPLETED_CREDITED
    if billed == 0:
        return FAILED_RESTORED
    return FAILED_CHARGED if credited == 0 else FAILED_PARTIAL


def apply_support(
    decision: Decision, *, extra_credit_micros: int, released: bool, ending: Ending
) -> Decision:
    """The decision with support's credit and release applied; unchanged when there is none.

    ``ending`` is how the run ended (``policy.ending.ending_of_events``), needed to word a
    released hold.
    """
    held = decision.outcome == HELD_FOR_REVIEW
    if extra_credit_micros == 0 and not (held and released):
        return decision
    if held and not released:
        return decision  # support has not decided the hold yet: credits wait with it
    credit = min(extra_credit_micros, decision.billed_micros)
    billed = decision.billed_micros - credit
    credited = decision.credited_micros + credit
    base_status = {Ending.COMPLETED: COMPLETED, Ending.USER_CANCELLED: CANCELLED}.get(
        ending, FAILED_CHARGED
    )
    status = status_after(base_status if held else decision.status, billed, credited, credit)
    explanation = after_support(
        decision.story,
        Amounts(decision.gross_micros, billed, credited),
        support_credit_micros=credit,
        released=held,
    )
    return msgspec.structs.replace(
        decision,
        outcome=outcome_for(billed, credited),
        billed_micros=billed,
        credited_micros=credited,
        status=status,
        explanation=explanation,
        rule_ids=tuple(sorted({*decision.rule_ids, "S1"})),
    )
