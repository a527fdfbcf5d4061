"""How a run ended is defined once (metering.policy.timeline.ending_event); every reader
agrees with the policy, ties included."""

from __future__ import annotations

from msgspec.structs import replace

from metering.policy import HELD_FOR_REVIEW, decide
from metering.policy.ending import Ending, ending_of_events
from metering.policy.status import CANCELLED
from metering.policy.support import apply_support
from tests.unit.policy_factories import at, event, line, run


def completed_and_user_cancel_at_one_instant():
    moment = at(10, 5)
    return [
        event("run.started", at=at(10), attempt=1),
        event("run.completed", at=moment, id="z-completed"),
        event("run.cancelled", at=moment, id="a-cancelled", by="user"),
    ]


def test_a_user_cancel_and_a_completion_at_one_instant_end_the_run_as_cancelled_everywhere():
    events = completed_and_user_cancel_at_one_instant()
    decision = decide(run(events=events, usage=[line(step=1, micros=1_000, at=at(10, 1))]))

    assert ending_of_events(events) is Ending.USER_CANCELLED
    assert decision.status == CANCELLED
    # Support's credit is worded with the same ending (settlement used a copy of the rule
    # that said "completed" here).
    held = replace(decision, outcome=HELD_FOR_REVIEW)  # e.g. over the protection cap (R8)
    released = apply_support(
        held, extra_credit_micros=0, released=True, ending=ending_of_events(events)
    )
    assert released.status == CANCELLED


def test_the_ending_does_not_depend_on_the_order_events_arrive_in():
    events = completed_and_user_cancel_at_one_instant()
    assert ending_of_events(reversed(events)) is ending_of_events(events)


def test_the_first_terminal_event_ends_the_run_and_a_late_completion_cannot_un_fail_it():
    events = [
        event("run.failed", at=at(10, 1), cause="provider"),
        event("run.completed", at=at(10, 2)),
    ]
    assert ending_of_events(events) is Ending.FAILED


def test_a_run_without_a_terminal_event_is_abandoned():
    assert ending_of_events([event("run.started", at=at(10), attempt=1)]) is Ending.ABANDONED
