"""The words a person reads after support acts: every policy outcome × every support action
gives one explanation that agrees with the amounts and the status (issue #15 item 10)."""

from __future__ import annotations

import pytest

from metering.policy import HELD_FOR_REVIEW, decide
from metering.policy.ending import ending_of_events
from metering.policy.explain import usd
from metering.policy.support import apply_support
from tests.unit.policy_factories import (
    at,
    completed,
    delivered,
    failed,
    line,
    lost,
    period,
    run,
    started,
)


def _lines():
    return [line(step=1, micros=30_000, at=at(10, 1)), line(step=2, micros=22_938, at=at(10, 2))]


SCENARIOS = {
    "completed": lambda: run(events=[started(at=at(10)), completed(at=at(10, 3))], usage=_lines()),
    "tool failure, charged": lambda: run(
        events=[started(at=at(10)), failed(cause="tool", at=at(10, 3))], usage=_lines()
    ),
    "server failure after a partial delivery": lambda: run(
        events=[
            started(at=at(10)),
            delivered(step=1, at=at(10, 1, 30)),
            lost(side="server", at=at(10, 1, 40)),
            failed(cause="server", at=at(10, 3)),
        ],
        usage=_lines(),
    ),
    "server failure, refunded": lambda: run(
        events=[started(at=at(10)), failed(cause="server", at=at(10, 3))], usage=_lines()
    ),
    "unverified failure, held (R7)": lambda: run(
        events=[started(at=at(10)), failed(cause="client", at=at(10, 3))], usage=_lines()
    ),
    "refund above the cap, held (R8)": lambda: run(
        events=[started(at=at(10)), failed(cause="server", at=at(10, 3))],
        usage=_lines(),
        period=period(gross_micros=60_000, credited_micros=10_000),
    ),
}

ACTIONS = {
    "credit": {"extra_credit_micros": 20_000, "released": False},
    "release": {"extra_credit_micros": 0, "released": True},
    "release and credit": {"extra_credit_micros": 20_000, "released": True},
}


def test_the_scenarios_cover_every_outcome():
    outcomes = {decide(make()).outcome for make in SCENARIOS.values()}
    assert outcomes == {"confirmed", "partially_credited", "refunded", HELD_FOR_REVIEW}


@pytest.mark.parametrize("action", ACTIONS)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_after_support_acts_the_explanation_agrees_with_the_amounts(scenario, action):
    facts = SCENARIOS[scenario]()
    policy = decide(facts)
    after = apply_support(policy, **ACTIONS[action], ending=ending_of_events(facts.events))
    words = after.explanation
    if after.outcome == HELD_FOR_REVIEW:
        # Support has not decided the hold: a credit waits with it, nothing changes.
        assert after == policy
        return
    assert "held for review" not in words and "until support resolves" not in words
    assert "Support reviewed" not in words or policy.outcome == HELD_FOR_REVIEW
    assert words.count(".") >= 1 and "  " not in words
    billed, credited = after.billed_micros, after.credited_micros
    if credited:
        assert "of usage is billed" not in words and "of usage was billed" not in words
    if billed:
        assert "was restored" not in words and f"The full {usd(after.gross_micros)}" not in words
    if after != policy:
        # The one closing names the amounts the run ends with.
        if credited and billed:
            assert words.endswith(f"{usd(billed)} is billed and {usd(credited)} credited.")
        elif credited:
            assert words.endswith(f"The full {usd(after.gross_micros)} is credited.")
        else:
            assert words.endswith(f"All {usd(after.gross_micros)} of usage is billed.")
        # The status words agree with the amounts too.
        status = after.status.lower()
        assert ("credited" in status or "restored" in status) == bool(credited) or (
            "cancelled" in status
        )
        assert ("restored" in status) == (billed == 0)


def test_a_release_says_the_hold_was_released_and_what_is_billed():
    facts = SCENARIOS["unverified failure, held (R7)"]()
    after = apply_support(
        decide(facts), extra_credit_micros=0, released=True, ending=ending_of_events(facts.events)
    )
    assert after.explanation.endswith(
        "Support reviewed the run and released the hold. All 0.052938 USD of usage is billed."
    )


def test_a_credit_on_a_charged_run_replaces_all_billed_with_the_split():
    facts = SCENARIOS["tool failure, charged"]()
    after = apply_support(
        decide(facts),
        extra_credit_micros=20_000,
        released=False,
        ending=ending_of_events(facts.events),
    )
    assert after.status == "Run failed — partially credited"
    assert after.explanation.endswith(
        "Support credited 0.02 USD. In all, 0.032938 USD is billed and 0.02 USD credited."
    )


@pytest.mark.parametrize("amount", [20_000, 52_938])
def test_a_credit_on_a_completed_run_says_support_credited_it_not_duplicate_work(amount):
    """Issue #31 item 2: a support credit on a clean completed run read "Completed — duplicate
    work credited" (the words of R1–R3) on the customer's statement; the run repeated
    nothing. Partial or full, the words say who credited it."""
    facts = SCENARIOS["completed"]()
    after = apply_support(
        decide(facts),
        extra_credit_micros=amount,
        released=False,
        ending=ending_of_events(facts.events),
    )
    assert after.status == "Completed — credited by support"
    assert "S1" in after.rule_ids
    assert after.credited_micros == amount
    assert after.outcome == ("refunded" if amount == 52_938 else "partially_credited")
