"""The per-run split a person reads: gross = billed + credited + held at every moment."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from metering.runs import DecisionView, ledger_position, tentative_micros

OUTCOMES = st.sampled_from(["confirmed", "partially_credited", "refunded", "held_for_review"])


def decision(*, outcome: str, gross_micros: int, credited_micros: int) -> DecisionView:
    return DecisionView(
        version=1,
        origin="policy",
        outcome=outcome,
        status="",
        gross_micros=gross_micros,
        billed_micros=gross_micros - credited_micros,
        credited_micros=credited_micros,
        rule_ids=[],
        evidence_event_ids=[],
        explanation="",
        period="2026-12",
        decided_at=datetime(2026, 12, 1, tzinfo=UTC),
    )


@given(
    outcome=OUTCOMES,
    decided_gross=st.integers(0, 10**12),
    credited_share=st.floats(0, 1),
    late_micros=st.integers(0, 10**12),
)
def test_a_reopened_run_adds_up_and_holds_its_late_usage(
    outcome, decided_gross, credited_share, late_micros
):
    credited = int(decided_gross * credited_share)
    in_force = decision(outcome=outcome, gross_micros=decided_gross, credited_micros=credited)
    gross = decided_gross + late_micros
    billed, credited_now, held = ledger_position(in_force, gross)
    assert billed is not None and credited_now is not None and held is not None
    assert billed + credited_now + held == gross
    assert min(billed, credited_now, held) >= 0
    assert held >= late_micros == tentative_micros(in_force, gross)
