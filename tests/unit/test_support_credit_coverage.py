"""Support credits cover the usage a run had when they were granted (pure, property-tested)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from metering.policy import UsageLine
from metering.policy.support import SupportGrant, covered_credit_micros
from tests.unit.policy_factories import at


def line(line_id: int, gross_micros: int) -> UsageLine:
    return UsageLine(line_id, f"e{line_id}", 1, 1, None, False, gross_micros, at(10))


amounts = st.integers(min_value=0, max_value=10**9)


@st.composite
def runs(draw: st.DrawFn) -> tuple[list[UsageLine], set[int], list[SupportGrant]]:
    """Usage lines (ids 1..n), the ones the policy credits, and grants covering prefixes."""
    grosses = draw(st.lists(amounts, min_size=1, max_size=12))
    lines = [line(i, gross) for i, gross in enumerate(grosses, start=1)]
    credited = draw(st.sets(st.integers(min_value=1, max_value=len(lines))))
    grants = draw(
        st.lists(
            st.builds(
                SupportGrant,
                amount_micros=st.integers(min_value=1, max_value=10**9),
                covers_line_id=st.integers(min_value=0, max_value=len(lines)),
            ),
            max_size=6,
        )
    )
    return lines, credited, grants


def billed(lines: list[UsageLine], credited: set[int], up_to: int | None = None) -> int:
    return sum(
        x.gross_micros
        for x in lines
        if x.line_id not in credited and (up_to is None or x.line_id <= up_to)
    )


@given(runs())
def test_support_credit_never_exceeds_the_grants_nor_what_the_policy_bills(run) -> None:
    lines, credited, grants = run
    applied = covered_credit_micros(grants, lines, credited)
    assert 0 <= applied <= sum(g.amount_micros for g in grants)
    assert applied <= billed(lines, credited)
    widest = max((g.covers_line_id for g in grants), default=0)
    assert applied <= billed(lines, credited, up_to=widest)


@given(runs(), st.lists(amounts, min_size=1, max_size=5))
def test_usage_arriving_after_the_grants_is_never_credited_by_them(run, late_grosses) -> None:
    lines, credited, grants = run
    first_late = len(lines) + 1
    late = [line(first_late + i, gross) for i, gross in enumerate(late_grosses)]
    before = covered_credit_micros(grants, lines, credited)
    assert covered_credit_micros(grants, lines + late, credited) == before


@given(runs())
def test_line_order_and_duplicates_do_not_change_the_credit(run) -> None:
    lines, credited, grants = run
    expected = covered_credit_micros(grants, lines, credited)
    shuffled = list(reversed(lines)) + lines[:2]
    assert covered_credit_micros(list(reversed(grants)), shuffled, credited) == expected


def test_a_grant_within_what_its_lines_bill_applies_in_full() -> None:
    lines = [line(1, 5_000_000), line(2, 5_000_000)]
    assert covered_credit_micros([SupportGrant(7_000_000, 2)], lines, set()) == 7_000_000


def test_a_line_the_policy_credits_later_shrinks_the_grant_instead_of_spilling() -> None:
    lines = [line(1, 5_000_000), line(2, 5_000_000), line(3, 4_000_000)]
    full_refund_of_first_two = [SupportGrant(10_000_000, 2)]
    assert covered_credit_micros(full_refund_of_first_two, lines, {2}) == 5_000_000
