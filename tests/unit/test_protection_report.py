"""The cost of protection report, pure: the parts add up, whatever the runs."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metering.policy import RunFacts
from metering.protection.attribution import attribute_lines
from metering.protection.report import (
    CREDIT_KINDS,
    RULES,
    SUPPORT,
    UNATTRIBUTED,
    CostedLine,
    Figures,
    SettledRun,
    build_report,
    decided_lines,
    run_figures,
)
from tests.unit.policy_factories import failed, line, lost, tool_call

T = datetime(2026, 11, 10, 12, tzinfo=UTC)


@st.composite
def settled_runs(draw: st.DrawFn, run_id: int) -> SettledRun:
    grosses = draw(st.lists(st.integers(0, 10**9), max_size=6))
    lines = tuple(
        CostedLine(run_id * 100 + i, gross, draw(st.none() | st.integers(0, 10**9)))
        for i, gross in enumerate(grosses)
    )
    gross = sum(grosses)
    held = draw(st.booleans())
    rules = st.sampled_from([*RULES, UNATTRIBUTED])
    credited = {ln.line_id: draw(rules) for ln in lines if draw(st.booleans())}
    policy_credited = sum(ln.gross_micros for ln in lines if ln.line_id in credited)
    support = draw(st.integers(0, gross - policy_credited))
    return SettledRun(
        run_id=run_id,
        customer_id=draw(st.sampled_from(["a", "b", "c"])),
        held=held,
        gross_micros=gross,
        billed_micros=gross - policy_credited - support,
        credited_micros=policy_credited + support,
        lines=lines,
        credited_by_line=credited,
    )


month = st.integers(1, 30).flatmap(lambda n: st.tuples(*(settled_runs(i) for i in range(n))))


@given(month, st.integers(1, 5))
def test_the_parts_add_up_for_every_customer_and_the_total(runs, top):
    report = build_report("acme", "2026-11", runs, top=top)
    for figures in [report.total, *(c.figures for c in report.customers)]:
        assert figures.credited_micros == sum(figures.by_rule().values())
        assert figures.gross_micros == figures.billed_micros + figures.credited_micros + (
            figures.held_micros
        )
        assert 0 <= figures.credited_cost_micros <= figures.cost_micros
        assert figures.credited_cost_micros == sum(figures.cost_by_rule().values())
        assert figures.margin_before_micros - figures.margin_after_micros == (
            figures.credited_micros + figures.held_micros
        )
    assert report.total == sum((c.figures for c in report.customers), Figures())
    assert report.total.runs == len(runs)
    assert [kind for kind, _ in report.total.credited_by_rule] == list(CREDIT_KINDS)
    assert [kind for kind, _ in report.total.credited_cost_by_rule] == list(CREDIT_KINDS)
    restored = [c.figures.credited_cost_micros for c in report.top_by_restored_cost]
    assert restored == sorted(restored, reverse=True) and len(restored) <= top
    assert all(amount > 0 for amount in restored)


@given(month)
def test_the_report_does_not_depend_on_the_order_of_the_runs(runs):
    forward = build_report("acme", "2026-11", runs)
    assert build_report("acme", "2026-11", reversed(runs)) == forward


def test_a_held_run_is_all_held_whatever_its_provisional_credits():
    run = SettledRun(1, "a", True, 300, 100, 200, (CostedLine(1, 300, 90),), {1: "R1"})
    figures = run_figures(run)
    assert (figures.held_micros, figures.billed_micros, figures.credited_micros) == (300, 0, 0)
    assert (figures.cost_micros, figures.credited_cost_micros) == (90, 0)


def test_support_cost_is_its_share_of_the_billed_lines_cost_rounded_half_even():
    lines = (CostedLine(1, 400, 100), CostedLine(2, 400, 301))
    run = SettledRun(1, "a", False, 800, 300, 500, lines, {1: "R2"})
    figures = run_figures(run)
    assert figures.by_rule()["R2"] == 400 and figures.by_rule()[SUPPORT] == 100
    # 100 of line 2's 400 billed: a quarter of its 301 cost, 75.25 → 75.
    assert figures.credited_cost_micros == 100 + 75
    assert (figures.cost_by_rule()["R2"], figures.cost_by_rule()[SUPPORT]) == (100, 75)


def test_lines_without_a_cost_are_counted_and_cost_nothing():
    run = SettledRun(1, "a", False, 30, 30, 0, (CostedLine(1, 10, 4), CostedLine(2, 20, None)))
    figures = run_figures(run)
    assert (figures.cost_micros, figures.uncosted_lines, figures.uncosted_gross_micros) == (
        4,
        1,
        20,
    )


def test_a_decision_covers_the_lowest_numbered_lines_up_to_its_gross():
    lines = [CostedLine(3, 5, 1), CostedLine(1, 10, 2), CostedLine(2, 0, 0), CostedLine(4, 7, 3)]
    assert [ln.line_id for ln in decided_lines(lines, 15)] == [1, 2, 3]
    assert decided_lines(lines, 0) == ()
    with pytest.raises(ValueError):
        decided_lines(lines, 16)


def test_impossible_amounts_are_refused():
    with pytest.raises(ValueError):
        run_figures(SettledRun(1, "a", False, 10, 5, 4, (CostedLine(1, 10, 1),)))
    with pytest.raises(ValueError):  # credited lines worth more than the decision credits
        run_figures(SettledRun(1, "a", False, 10, 5, 5, (CostedLine(1, 10, 1),), {1: "R1"}))


def test_one_crediting_rule_takes_every_credited_line_without_reading_facts():
    def no_facts() -> RunFacts:
        raise AssertionError("not needed")

    assert attribute_lines([4, 5], ["R0", "R4", "R6"], no_facts) == {4: "R4", 5: "R4"}
    assert attribute_lines([], ["R1", "R2"], no_facts) == {}


def test_a_line_two_rules_name_goes_to_the_first_and_the_rest_to_the_ending_rule():
    first = line(step=1, micros=300, at=T, tool_call_id="tc-7")
    done = tool_call(tool_call_id="tc-7", step=1, at=T.replace(minute=1))
    repeat = line(step=2, micros=250, at=T.replace(minute=2), tool_call_id="tc-7")
    drop = lost(side="server", at=T.replace(minute=3))
    end = failed(cause="network", at=T.replace(minute=4))
    facts = RunFacts(events=(done, drop, end), usage=(first, repeat))
    credited = [first.line_id, repeat.line_id]
    attributed = attribute_lines(credited, ["R1", "R4"], lambda: facts)
    assert attributed == {first.line_id: "R4", repeat.line_id: "R1"}
    # A credited line no rule names any more is counted apart, not given to a rule.
    assert attribute_lines([*credited, 999], ["R1", "R4"], lambda: facts)[999] == UNATTRIBUTED
