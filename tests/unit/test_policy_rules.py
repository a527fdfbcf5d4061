"""Settlement policy v1 (docs/policy.md), rule by rule, amounts exact to the micro-dollar."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from metering.policy import (
    CONFIRMED,
    HELD_FOR_REVIEW,
    PARTIALLY_CREDITED,
    REFUNDED,
    CustomerPeriod,
    Decision,
    PolicyConfig,
    RunFacts,
    UsageLine,
    decide,
    status,
)
from tests.unit.policy_factories import (
    at,
    cancelled,
    checkpoint,
    completed,
    delivered,
    failed,
    heartbeat,
    line,
    lost,
    period,
    restored,
    resumed,
    run,
    started,
    tool_call,
)


def assert_money(
    decision: Decision, *, billed: int, credited: int, lines: tuple[int, ...] = ()
) -> None:
    assert (decision.billed_micros, decision.credited_micros) == (billed, credited)
    assert decision.gross_micros == billed + credited
    assert decision.credited_line_ids == tuple(sorted(lines))


# R0 normal ---------------------------------------------------------------------------------


def test_bills_everything_for_a_completed_run_without_interruptions() -> None:
    end = completed(at=at(10, 50))
    decision = decide(
        run(
            events=[started(at=at(10)), end],
            usage=[
                line(step=1, micros=400_000, at=at(10, 5)),
                line(step=2, micros=1_020_000, at=at(10, 9)),
            ],
        )
    )
    assert decision.outcome == CONFIRMED
    assert_money(decision, billed=1_420_000, credited=0)
    assert decision.rule_ids == ("R0",)
    assert decision.evidence_event_ids == (end.event_id,)
    assert decision.status == status.COMPLETED
    assert decision.explanation == "The run completed at 10:50. All 1.42 USD of usage was billed."


def test_confirms_a_completed_run_with_no_usage() -> None:
    decision = decide(run(events=[completed(at=at(10, 1))]))
    assert decision.outcome == CONFIRMED
    assert_money(decision, billed=0, credited=0)
    assert decision.rule_ids == ("R0",)
    assert decision.status == status.COMPLETED
    assert "No usage was recorded" in decision.explanation


def test_confirms_a_failed_run_with_no_usage_instead_of_holding_it() -> None:
    decision = decide(run(events=[failed(cause="unknown", at=at(10, 1))]))
    assert decision.outcome == CONFIRMED
    assert decision.rule_ids == ("R0",)
    assert decision.status == status.FAILED_RESTORED
    assert decision.explanation.endswith("No usage was recorded, so nothing was charged.")


def test_heartbeats_and_restored_client_blips_change_nothing() -> None:
    decision = decide(
        run(
            events=[
                heartbeat(at=at(10, 2)),
                lost(side="client", at=at(10, 3)),
                restored(side="client", at=at(10, 4)),
                completed(at=at(10, 9)),
            ],
            usage=[line(step=1, micros=777_777, at=at(10, 5))],
        )
    )
    assert decision.outcome == CONFIRMED
    assert_money(decision, billed=777_777, credited=0)


# R1 duplicate tool call --------------------------------------------------------------------


def test_credits_a_model_call_that_repeats_an_already_completed_tool_call() -> None:
    first = line(step=2, micros=300_000, at=at(10, 5), tool_call_id="tc-7")
    done = tool_call(tool_call_id="tc-7", step=2, at=at(10, 6))
    repeat = line(step=3, micros=250_000, at=at(10, 8), tool_call_id="tc-7")
    other = line(step=4, micros=500_000, at=at(10, 9))
    end = completed(at=at(10, 12))
    decision = decide(run(events=[done, end], usage=[first, repeat, other]))
    assert decision.outcome == PARTIALLY_CREDITED
    assert_money(decision, billed=800_000, credited=250_000, lines=(repeat.line_id,))
    assert decision.rule_ids == ("R1",)
    assert decision.evidence_event_ids == tuple(
        sorted([repeat.event_id, done.event_id, end.event_id])
    )
    assert decision.status == status.COMPLETED_CREDITED
    assert decision.explanation == (
        "The run completed at 10:12. 1 model call repeated a tool call that had already "
        "completed; 0.25 USD was credited. 0.80 USD was billed and 0.25 USD credited."
    )


def test_bills_a_repeat_made_before_the_tool_call_completed() -> None:
    decision = decide(
        run(
            events=[tool_call(tool_call_id="tc-1", step=1, at=at(10, 9)), completed(at=at(10, 10))],
            usage=[
                line(step=1, micros=100_000, at=at(10, 1), tool_call_id="tc-1"),
                line(step=1, micros=100_000, at=at(10, 2), tool_call_id="tc-1"),
            ],
        )
    )
    assert_money(decision, billed=200_000, credited=0)


def test_bills_a_repeat_of_a_tool_call_that_failed() -> None:
    decision = decide(
        run(
            events=[
                tool_call(tool_call_id="tc-1", step=1, at=at(10, 2), status="failed"),
                completed(at=at(10, 10)),
            ],
            usage=[
                line(step=1, micros=100_000, at=at(10, 1), tool_call_id="tc-1"),
                line(step=1, micros=100_000, at=at(10, 3), tool_call_id="tc-1"),
            ],
        )
    )
    assert_money(decision, billed=200_000, credited=0)


def test_bills_the_first_usage_of_a_tool_call_even_after_its_completion_event() -> None:
    # Clocks of different sources disagree; the first execution is always paid for.
    first = line(step=1, micros=100_000, at=at(10, 3), tool_call_id="tc-1")
    again = line(step=2, micros=40_000, at=at(10, 4), tool_call_id="tc-1")
    decision = decide(
        run(
            events=[tool_call(tool_call_id="tc-1", step=1, at=at(10, 2)), completed(at=at(10, 9))],
            usage=[first, again],
        )
    )
    assert_money(decision, billed=100_000, credited=40_000, lines=(again.line_id,))


def test_credits_a_duplicate_tool_call_even_when_the_user_cancels() -> None:
    repeat = line(step=2, micros=60_000, at=at(10, 4), tool_call_id="tc-1")
    decision = decide(
        run(
            events=[
                tool_call(tool_call_id="tc-1", step=1, at=at(10, 2)),
                cancelled(by="user", at=at(10, 5)),
            ],
            usage=[line(step=1, micros=90_000, at=at(10, 1), tool_call_id="tc-1"), repeat],
        )
    )
    assert decision.rule_ids == ("R1", "R6")
    assert_money(decision, billed=90_000, credited=60_000, lines=(repeat.line_id,))
    assert decision.status == status.CANCELLED


# R2 replayed context -----------------------------------------------------------------------


def test_credits_replayed_context_in_a_resumed_attempt() -> None:
    replay = line(step=3, attempt=2, micros=120_000, at=at(10, 21), replay=True)
    resume = resumed(attempt=2, at=at(10, 20))
    decision = decide(
        run(
            events=[lost(side="client", at=at(10, 15)), resume, completed(at=at(10, 30))],
            usage=[
                line(step=1, micros=500_000, at=at(10, 5)),
                replay,
                line(step=2, attempt=2, micros=380_000, at=at(10, 22)),
            ],
        )
    )
    assert decision.rule_ids == ("R2",)
    assert_money(decision, billed=880_000, credited=120_000, lines=(replay.line_id,))
    assert resume.event_id in decision.evidence_event_ids
    assert replay.event_id in decision.evidence_event_ids
    assert (
        "After the resume at 10:20, 1 model call only rebuilt context; 0.12 USD was credited."
        in decision.explanation
    )


def test_credits_replay_after_a_resume_even_when_the_attempt_is_not_numbered() -> None:
    replay = line(step=1, micros=10_000, at=at(10, 21), replay=True)
    decision = decide(
        run(events=[resumed(attempt=2, at=at(10, 20)), completed(at=at(10, 30))], usage=[replay])
    )
    assert_money(decision, billed=0, credited=10_000, lines=(replay.line_id,))
    assert decision.status == status.COMPLETED_CREDITED


def test_bills_replay_in_the_first_attempt_without_a_resume() -> None:
    decision = decide(
        run(
            events=[completed(at=at(10, 30))],
            usage=[line(step=1, micros=10_000, at=at(10, 21), replay=True)],
        )
    )
    assert_money(decision, billed=10_000, credited=0)


# R3 lost work ------------------------------------------------------------------------------


def interrupted_run_usage() -> dict[str, UsageLine]:
    """Attempt 1 saves step 2, does 3 and 4, the drop happens; attempt 2 redoes 3 and 4."""
    return {
        "s1": line(step=1, micros=100_000, at=at(10, 1)),
        "s2": line(step=2, micros=200_000, at=at(10, 2)),
        "s3": line(step=3, micros=300_000, at=at(10, 4)),
        "s4": line(step=4, micros=400_000, at=at(10, 5)),
        "s3b": line(step=3, attempt=2, micros=310_000, at=at(10, 12)),
        "s4b": line(step=4, attempt=2, micros=410_000, at=at(10, 13)),
    }


def test_credits_the_interrupted_copy_of_steps_after_the_last_checkpoint() -> None:
    lines = interrupted_run_usage()
    drop = lost(side="server", at=at(10, 6))
    saved = checkpoint(step=2, at=at(10, 3))
    decision = decide(
        run(
            events=[saved, drop, resumed(attempt=2, at=at(10, 10)), completed(at=at(10, 20))],
            usage=lines.values(),
        )
    )
    s3, s4 = lines["s3"], lines["s4"]
    assert decision.rule_ids == ("R3",)
    assert_money(decision, billed=1_020_000, credited=700_000, lines=(s3.line_id, s4.line_id))
    assert {drop.event_id, saved.event_id} <= set(decision.evidence_event_ids)
    assert decision.status == status.COMPLETED_CREDITED
    assert (
        "Work after the checkpoint at step 2 was lost when the connection dropped on our side "
        "at 10:06 and was redone after the resume; the lost copy (2 model calls, 0.70 USD) was "
        "credited." in decision.explanation
    )


def test_credits_every_redone_step_when_nothing_was_checkpointed() -> None:
    lines = interrupted_run_usage()
    decision = decide(
        run(
            events=[
                lost(side="server", at=at(10, 6)),
                resumed(attempt=2, at=at(10, 10)),
                completed(at=at(10, 20)),
            ],
            usage=lines.values(),
        )
    )
    # Steps 1 and 2 were not redone in attempt 2, so only 3 and 4 are lost copies.
    lost_copies = (lines["s3"].line_id, lines["s4"].line_id)
    assert_money(decision, billed=1_020_000, credited=700_000, lines=lost_copies)
    assert "Work since the start of the run was lost" in decision.explanation


def test_does_not_credit_steps_saved_by_a_checkpoint() -> None:
    s2 = line(step=2, micros=200_000, at=at(10, 2))
    s2b = line(step=2, attempt=2, micros=200_000, at=at(10, 12))
    decision = decide(
        run(
            events=[
                checkpoint(step=2, at=at(10, 3)),
                lost(side="server", at=at(10, 6)),
                resumed(attempt=2, at=at(10, 10)),
                completed(at=at(10, 20)),
            ],
            usage=[s2, s2b],
        )
    )
    assert_money(decision, billed=400_000, credited=0)
    assert decision.rule_ids == ("R0",)


def test_does_not_treat_a_client_side_drop_as_lost_work() -> None:
    lines = interrupted_run_usage()
    decision = decide(
        run(
            events=[
                checkpoint(step=2, at=at(10, 3)),
                lost(side="client", at=at(10, 6)),
                resumed(attempt=2, at=at(10, 10)),
                completed(at=at(10, 20)),
            ],
            usage=lines.values(),
        )
    )
    assert_money(decision, billed=1_720_000, credited=0)


def test_a_replayed_call_does_not_count_as_redoing_a_step() -> None:
    s3 = line(step=3, micros=300_000, at=at(10, 4))
    replay = line(step=3, attempt=2, micros=30_000, at=at(10, 12), replay=True)
    decision = decide(
        run(
            events=[
                lost(side="server", at=at(10, 6)),
                resumed(attempt=2, at=at(10, 10)),
                completed(at=at(10, 20)),
            ],
            usage=[s3, replay],
        )
    )
    assert decision.rule_ids == ("R2",)
    assert_money(decision, billed=300_000, credited=30_000, lines=(replay.line_id,))


def test_bills_a_step_lost_twice_only_for_its_last_copy_when_the_run_completes() -> None:
    copies = [line(step=1, attempt=n, micros=100_000 * n, at=at(10, 10 * n)) for n in (1, 2, 3)]
    decision = decide(
        run(
            events=[
                lost(side="server", at=at(10, 15)),
                resumed(attempt=2, at=at(10, 16)),
                lost(side="server", at=at(10, 25)),
                resumed(attempt=3, at=at(10, 26)),
                completed(at=at(10, 40)),
            ],
            usage=copies,
        )
    )
    assert_money(
        decision,
        billed=300_000,
        credited=300_000,
        lines=(copies[0].line_id, copies[1].line_id),
    )


def test_credits_a_lost_first_copy_of_a_tool_call_once_not_twice() -> None:
    # Attempt 1 ran tc-4 and it completed, then the work was lost; attempt 2's re-execution
    # is the copy the customer pays for, not a duplicate on top of the lost one.
    lost_copy = line(step=4, micros=400_000, at=at(10, 4), tool_call_id="tc-4")
    redone = line(step=4, attempt=2, micros=420_000, at=at(10, 12), tool_call_id="tc-4")
    decision = decide(
        run(
            events=[
                tool_call(tool_call_id="tc-4", step=4, at=at(10, 5)),
                lost(side="server", at=at(10, 6)),
                resumed(attempt=2, at=at(10, 10)),
                completed(at=at(10, 20)),
            ],
            usage=[lost_copy, redone],
        )
    )
    assert decision.rule_ids == ("R3",)
    assert_money(decision, billed=420_000, credited=400_000, lines=(lost_copy.line_id,))


# R1 + R2 + R3 together ---------------------------------------------------------------------


def test_resumed_run_credits_replay_lost_work_and_a_duplicate_tool_call() -> None:
    s1 = line(step=1, micros=100_000, at=at(10, 0), tool_call_id="tc-a")
    s2 = line(step=2, micros=200_000, at=at(10, 2))
    s3 = line(step=3, micros=300_000, at=at(10, 4))
    s4 = line(step=4, micros=400_000, at=at(10, 5))
    replay = line(step=2, attempt=2, micros=50_000, at=at(10, 11), replay=True)
    s3b = line(step=3, attempt=2, micros=310_000, at=at(10, 12))
    s4b = line(step=4, attempt=2, micros=410_000, at=at(10, 13))
    repeat = line(step=5, attempt=2, micros=60_000, at=at(10, 14), tool_call_id="tc-a")
    decision = decide(
        run(
            events=[
                started(at=at(9, 59)),
                tool_call(tool_call_id="tc-a", step=1, at=at(10, 1)),
                checkpoint(step=2, at=at(10, 3)),
                lost(side="server", at=at(10, 6)),
                resumed(attempt=2, at=at(10, 10), from_checkpoint="cp-2"),
                completed(at=at(10, 20)),
            ],
            usage=[s1, s2, s3, s4, replay, s3b, s4b, repeat],
        )
    )
    assert decision.outcome == PARTIALLY_CREDITED
    assert decision.rule_ids == ("R1", "R2", "R3")
    assert_money(
        decision,
        billed=1_020_000,
        credited=810_000,
        lines=(s3.line_id, s4.line_id, replay.line_id, repeat.line_id),
    )
    assert decision.status == status.COMPLETED_CREDITED
    assert decision.explanation == (
        "The run completed at 10:20. "
        "1 model call repeated a tool call that had already completed; 0.06 USD was credited. "
        "After the resume at 10:10, 1 model call only rebuilt context; 0.05 USD was credited. "
        "Work after the checkpoint at step 2 was lost when the connection dropped on our side "
        "at 10:06 and was redone after the resume; the lost copy (2 model calls, 0.70 USD) was "
        "credited. 1.02 USD was billed and 0.81 USD credited."
    )


# R4 no usable result -----------------------------------------------------------------------


def test_refunds_run_with_no_delivery_after_server_side_disconnect() -> None:
    drop = lost(side="server", at=at(10, 42))
    end = failed(cause="unknown", at=at(10, 44))
    decision = decide(
        run(events=[drop, end], usage=[line(step=1, micros=1_420_000, at=at(10, 30))])
    )
    assert decision.outcome == REFUNDED
    assert decision.rule_ids == ("R4",)
    assert_money(decision, billed=0, credited=1_420_000, lines=decision.credited_line_ids)
    assert decision.evidence_event_ids == tuple(sorted([drop.event_id, end.event_id]))
    assert decision.status == status.FAILED_RESTORED
    assert decision.explanation == (
        "The connection dropped on our side at 10:42 and no result was delivered; "
        "the full 1.42 USD was restored."
    )


def test_refunds_abandoned_run_with_server_drop_and_no_delivery() -> None:
    a = line(step=1, micros=420_000, at=at(10, 30))
    b = line(step=2, micros=1_000_000, at=at(10, 40))
    decision = decide(run(events=[lost(side="server", at=at(10, 42))], usage=[a, b]))
    assert decision.outcome == REFUNDED
    assert_money(decision, billed=0, credited=1_420_000, lines=(a.line_id, b.line_id))
    assert decision.status == status.FAILED_RESTORED
    assert decision.explanation == (
        "The connection dropped on our side at 10:42 and no result was delivered; "
        "the full 1.42 USD was restored."
    )


@pytest.mark.parametrize(
    ("cause", "reason"),
    [
        ("network", "a network error"),
        ("server", "a server error"),
        ("provider", "a model provider error"),
    ],
)
def test_refunds_a_server_side_failure_without_delivery(cause: str, reason: str) -> None:
    decision = decide(
        run(
            events=[failed(cause=cause, at=at(11, 5))],
            usage=[line(step=1, micros=2_500_001, at=at(11))],
        )
    )
    assert decision.outcome == REFUNDED
    assert decision.rule_ids == ("R4",)
    assert decision.explanation == (
        f"The run failed at 11:05 because of {reason} and no result was delivered; "
        "the full 2.500001 USD was restored."
    )


def test_refunds_a_run_cancelled_by_the_system_as_a_server_failure() -> None:
    decision = decide(
        run(
            events=[cancelled(by="system", at=at(12, 0))],
            usage=[line(step=1, micros=333_333, at=at(11, 59))],
        )
    )
    assert decision.outcome == REFUNDED
    assert decision.rule_ids == ("R4", "R6")
    assert decision.status == status.FAILED_RESTORED
    assert decision.explanation.startswith("Our system cancelled the run at 12:00")


def test_holds_a_failure_after_a_server_drop_that_was_restored() -> None:
    decision = decide(
        run(
            events=[
                lost(side="server", at=at(10, 1)),
                restored(side="server", at=at(10, 2)),
                failed(cause="unknown", at=at(10, 9)),
            ],
            usage=[line(step=1, micros=500_000, at=at(10, 5))],
        )
    )
    assert decision.outcome == HELD_FOR_REVIEW
    assert decision.rule_ids == ("R7",)


def test_ignores_a_server_drop_reported_after_the_run_ended() -> None:
    decision = decide(
        run(
            events=[failed(cause="unknown", at=at(10, 9)), lost(side="server", at=at(10, 10))],
            usage=[line(step=1, micros=500_000, at=at(10, 5))],
        )
    )
    assert decision.outcome == HELD_FOR_REVIEW


# R5 partial result -------------------------------------------------------------------------


def test_partial_delivery_then_provider_failure_bills_only_delivered_steps() -> None:
    steps = [line(step=n, micros=100_000 * n, at=at(10, n)) for n in (1, 2, 3, 4)]
    shown = delivered(step=2, at=at(10, 2, 30))
    end = failed(cause="provider", at=at(10, 42))
    decision = decide(run(events=[delivered(step=1, at=at(10, 1, 30)), shown, end], usage=steps))
    assert decision.outcome == PARTIALLY_CREDITED
    assert decision.rule_ids == ("R5",)
    assert_money(
        decision, billed=300_000, credited=700_000, lines=(steps[2].line_id, steps[3].line_id)
    )
    assert decision.evidence_event_ids == tuple(sorted([shown.event_id, end.event_id]))
    assert decision.status == status.FAILED_PARTIAL
    assert decision.explanation == (
        "The run failed at 10:42 because of a model provider error; output up to step 2 was "
        "delivered. 0.30 USD was billed and 0.70 USD credited."
    )


def test_abandoned_run_after_a_delivery_and_server_drop_is_partially_credited() -> None:
    steps = [line(step=n, micros=250_000, at=at(10, n)) for n in (1, 2, 3)]
    decision = decide(
        run(
            events=[
                delivered(step=1, at=at(10, 1, 30), kind="changes"),
                lost(side="server", at=at(10, 5)),
            ],
            usage=steps,
        )
    )
    assert_money(
        decision, billed=250_000, credited=500_000, lines=(steps[1].line_id, steps[2].line_id)
    )
    assert decision.status == status.FAILED_PARTIAL


def test_charges_a_failed_run_whose_whole_output_was_delivered() -> None:
    decision = decide(
        run(
            events=[
                delivered(step=2, kind="final", at=at(10, 3)),
                failed(cause="server", at=at(10, 4)),
            ],
            usage=[line(step=1, micros=1, at=at(10, 1)), line(step=2, micros=2, at=at(10, 2))],
        )
    )
    assert decision.outcome == CONFIRMED
    assert decision.rule_ids == ("R5",)
    assert_money(decision, billed=3, credited=0)
    assert decision.status == status.FAILED_CHARGED


def test_refunds_everything_when_the_delivery_came_before_any_usage_step() -> None:
    decision = decide(
        run(
            events=[delivered(step=0, at=at(10, 0)), failed(cause="network", at=at(10, 4))],
            usage=[line(step=1, micros=5, at=at(10, 1)), line(step=2, micros=7, at=at(10, 2))],
        )
    )
    assert decision.outcome == REFUNDED
    assert decision.rule_ids == ("R5",)
    assert decision.status == status.FAILED_RESTORED


def test_partial_credit_also_credits_duplicates_of_delivered_steps() -> None:
    first = line(step=1, micros=100_000, at=at(10, 1), tool_call_id="tc-1")
    repeat = line(step=1, micros=100_000, at=at(10, 3), tool_call_id="tc-1")
    later = line(step=2, micros=100_000, at=at(10, 4))
    decision = decide(
        run(
            events=[
                tool_call(tool_call_id="tc-1", step=1, at=at(10, 2)),
                delivered(step=1, at=at(10, 3, 30)),
                failed(cause="provider", at=at(10, 5)),
            ],
            usage=[first, repeat, later],
        )
    )
    assert decision.rule_ids == ("R1", "R5")
    assert_money(decision, billed=100_000, credited=200_000, lines=(repeat.line_id, later.line_id))


# R6 user cancel ----------------------------------------------------------------------------


def test_bills_a_run_cancelled_by_the_user() -> None:
    decision = decide(
        run(
            events=[cancelled(by="user", at=at(10, 50))],
            usage=[line(step=1, micros=1_420_000, at=at(10, 40))],
        )
    )
    assert decision.outcome == CONFIRMED
    assert decision.rule_ids == ("R6",)
    assert_money(decision, billed=1_420_000, credited=0)
    assert decision.status == status.CANCELLED
    assert decision.explanation == (
        "The run was cancelled by the user at 10:50. All 1.42 USD of usage was billed."
    )


def test_user_cancel_after_a_server_side_drop_is_billed() -> None:
    decision = decide(
        run(
            events=[lost(side="server", at=at(10, 42)), cancelled(by="user", at=at(10, 43))],
            usage=[line(step=1, micros=900_000, at=at(10, 40))],
        )
    )
    assert decision.outcome == CONFIRMED
    assert decision.rule_ids == ("R6",)
    assert_money(decision, billed=900_000, credited=0)
    assert decision.status == status.CANCELLED


def test_user_cancel_still_credits_lost_work() -> None:
    lines = interrupted_run_usage()
    decision = decide(
        run(
            events=[
                checkpoint(step=2, at=at(10, 3)),
                lost(side="server", at=at(10, 6)),
                resumed(attempt=2, at=at(10, 10)),
                cancelled(by="user", at=at(10, 20)),
            ],
            usage=lines.values(),
        )
    )
    assert decision.rule_ids == ("R3", "R6")
    lost_copies = (lines["s3"].line_id, lines["s4"].line_id)
    assert_money(decision, billed=1_020_000, credited=700_000, lines=lost_copies)
    assert decision.status == status.CANCELLED


# R7 unverified -----------------------------------------------------------------------------


def test_holds_a_run_with_only_a_client_side_claim() -> None:
    claim = lost(side="client", at=at(10, 42))
    decision = decide(run(events=[claim], usage=[line(step=1, micros=1_420_000, at=at(10, 40))]))
    assert decision.outcome == HELD_FOR_REVIEW
    assert decision.rule_ids == ("R7",)
    assert decision.evidence_event_ids == (claim.event_id,)
    assert_money(decision, billed=1_420_000, credited=0)
    assert decision.status == status.UNDER_REVIEW
    assert decision.explanation == (
        "The run stopped reporting at 10:42 without finishing. Your app reported a lost "
        "connection at 10:42, but our systems saw no interruption. Its 1.42 USD of usage is "
        "held for review; nothing is billed until support resolves it."
    )


def test_holds_a_failure_with_a_client_cause() -> None:
    decision = decide(
        run(
            events=[failed(cause="client", at=at(9, 7))],
            usage=[line(step=1, micros=5, at=at(9, 6))],
        )
    )
    assert decision.outcome == HELD_FOR_REVIEW
    assert decision.explanation.startswith(
        "The run failed at 09:07 with a cause reported by your app, and our systems saw no "
        "interruption."
    )


def test_holds_a_failure_with_an_unknown_cause() -> None:
    decision = decide(
        run(
            events=[failed(cause="unknown", at=at(9, 7))],
            usage=[line(step=1, micros=5, at=at(9, 6))],
        )
    )
    assert decision.outcome == HELD_FOR_REVIEW
    assert decision.rule_ids == ("R7",)
    assert "for an unknown reason" in decision.explanation


def test_holds_an_abandoned_run_without_any_evidence() -> None:
    decision = decide(
        run(
            events=[heartbeat(at=at(23, 59))], usage=[line(step=1, micros=2_000_000, at=at(23, 30))]
        )
    )
    assert decision.outcome == HELD_FOR_REVIEW
    assert decision.rule_ids == ("R7",)
    assert decision.evidence_event_ids == ()
    assert decision.status == status.UNDER_REVIEW
    assert decision.explanation == (
        "The run stopped reporting at 23:59 without finishing, and our systems saw no "
        "interruption. Its 2.00 USD of usage is held for review; nothing is billed until "
        "support resolves it."
    )


def test_a_held_run_keeps_duplicate_work_credits_provisionally() -> None:
    replay = line(step=1, attempt=2, micros=40_000, at=at(10, 21), replay=True)
    decision = decide(
        run(
            events=[resumed(attempt=2, at=at(10, 20)), lost(side="client", at=at(10, 30))],
            usage=[line(step=1, micros=500_000, at=at(10, 5)), replay],
        )
    )
    assert decision.outcome == HELD_FOR_REVIEW
    assert decision.rule_ids == ("R2", "R7")
    assert_money(decision, billed=500_000, credited=40_000, lines=(replay.line_id,))


def test_charges_a_run_that_failed_because_of_a_tool() -> None:
    end = failed(cause="tool", at=at(14, 15))
    decision = decide(run(events=[end], usage=[line(step=1, micros=1_500_000, at=at(14, 10))]))
    assert decision.outcome == CONFIRMED
    assert decision.rule_ids == ("R0",)
    assert decision.evidence_event_ids == (end.event_id,)
    assert_money(decision, billed=1_500_000, credited=0)
    assert decision.status == status.FAILED_CHARGED
    assert decision.explanation == (
        "The run failed at 14:15 because a tool failed, which usage protection does not cover. "
        "All 1.50 USD of usage was billed."
    )


def test_protects_a_tool_failure_when_our_side_saw_the_connection_drop() -> None:
    decision = decide(
        run(
            events=[lost(side="server", at=at(14, 14)), failed(cause="tool", at=at(14, 15))],
            usage=[line(step=1, micros=1_500_000, at=at(14, 10))],
        )
    )
    assert decision.outcome == REFUNDED
    assert decision.rule_ids == ("R4",)


# R8 protection cap -------------------------------------------------------------------------


def server_drop_refund(*, micros: int, period: CustomerPeriod) -> RunFacts:
    """An abandoned run R4 would refund in full."""
    return run(
        events=[lost(side="server", at=at(10, 42))],
        usage=[line(step=1, micros=micros, at=at(10, 40))],
        period=period,
    )


def test_holds_a_refund_that_would_exceed_the_period_credit_cap() -> None:
    # Cap: max(25 % of 40 USD, 5 USD) = 10 USD; 9 USD already credited + 1.42 USD > 10 USD.
    facts = server_drop_refund(
        micros=1_420_000, period=period(gross_micros=40_000_000, credited_micros=9_000_000)
    )
    decision = decide(facts)
    assert decision.outcome == HELD_FOR_REVIEW
    assert decision.rule_ids == ("R4", "R8")
    assert_money(decision, billed=1_420_000, credited=0)
    assert decision.status == status.UNDER_REVIEW
    assert decision.explanation == (
        "The connection dropped on our side at 10:42 and no result was delivered. Crediting "
        "1.42 USD automatically would take this period's automatic credits to 10.42 USD, above "
        "the 10.00 USD limit, so the run is held for review; nothing is billed until support "
        "resolves it."
    )


def test_allows_automatic_credits_up_to_exactly_the_cap() -> None:
    facts = server_drop_refund(
        micros=1_000_000, period=period(gross_micros=40_000_000, credited_micros=9_000_000)
    )
    assert decide(facts).outcome == REFUNDED


def test_uses_the_cap_floor_for_small_periods() -> None:
    # 25 % of 4 USD is 1 USD, so the 5 USD floor is the cap.
    within = period(gross_micros=4_000_000, credited_micros=3_580_000)
    over = period(gross_micros=4_000_000, credited_micros=3_580_001)
    assert decide(server_drop_refund(micros=1_420_000, period=within)).outcome == REFUNDED
    held = decide(server_drop_refund(micros=1_420_000, period=over))
    assert held.outcome == HELD_FOR_REVIEW
    assert "above the 5.00 USD limit" in held.explanation


def test_holds_the_refund_that_would_exceed_the_refunded_run_count() -> None:
    twentieth = decide(server_drop_refund(micros=10_000, period=period(refunded_runs=19)))
    twenty_first = decide(server_drop_refund(micros=10_000, period=period(refunded_runs=20)))
    assert twentieth.outcome == REFUNDED
    assert twenty_first.outcome == HELD_FOR_REVIEW
    assert twenty_first.rule_ids == ("R4", "R8")
    assert "would make 21 fully refunded runs this period, above the limit of 20" in (
        twenty_first.explanation
    )


def test_run_count_cap_does_not_apply_to_partial_credits() -> None:
    steps = [line(step=n, micros=100_000, at=at(10, n)) for n in (1, 2)]
    decision = decide(
        run(
            events=[delivered(step=1, at=at(10, 1, 30)), failed(cause="provider", at=at(10, 5))],
            usage=steps,
            period=period(refunded_runs=500),
        )
    )
    assert decision.outcome == PARTIALLY_CREDITED


def test_cap_also_holds_duplicate_work_credits_on_a_completed_run() -> None:
    first = line(step=1, micros=1_000_000, at=at(10, 1), tool_call_id="tc-1")
    repeat = line(step=2, micros=6_000_000, at=at(10, 3), tool_call_id="tc-1")
    decision = decide(
        run(
            events=[tool_call(tool_call_id="tc-1", step=1, at=at(10, 2)), completed(at=at(10, 9))],
            usage=[first, repeat],
            period=period(gross_micros=7_000_000),
        )
    )
    assert decision.outcome == HELD_FOR_REVIEW
    assert decision.rule_ids == ("R1", "R8")
    # Provisional: the R1 credit stays on the held decision; nothing is posted while held.
    assert_money(decision, billed=1_000_000, credited=6_000_000, lines=(repeat.line_id,))


def test_cap_follows_the_policy_config() -> None:
    config = PolicyConfig(cap_fraction_ppm=500_000, cap_floor_micros=0, cap_runs=0)
    facts = server_drop_refund(micros=1_000_000, period=period(gross_micros=2_000_000))
    assert decide(facts, config).outcome == HELD_FOR_REVIEW  # the run count cap of 0
    loose = PolicyConfig(cap_fraction_ppm=500_000, cap_floor_micros=0, cap_runs=1)
    assert decide(facts, loose).outcome == REFUNDED  # 1 USD is exactly 50 % of 2 USD


# Canonical facts ---------------------------------------------------------------------------


def test_the_earliest_terminal_event_ends_the_run() -> None:
    decision = decide(
        run(
            events=[completed(at=at(10, 9)), failed(cause="provider", at=at(10, 8))],
            usage=[line(step=1, micros=100, at=at(10, 1))],
        )
    )
    assert decision.outcome == REFUNDED


def test_ties_between_terminal_events_go_to_the_type_then_the_id() -> None:
    decision = decide(
        run(
            events=[failed(cause="provider", at=at(10, 8)), completed(at=at(10, 8))],
            usage=[line(step=1, micros=100, at=at(10, 1))],
        )
    )
    assert decision.outcome == CONFIRMED  # "run.completed" sorts before "run.failed"


def test_same_facts_in_any_order_and_with_duplicates_give_the_same_decision() -> None:
    s1 = line(step=1, micros=100_000, at=at(10, 1))
    s2 = line(step=2, micros=200_000, at=at(10, 2))
    events = [delivered(step=1, at=at(10, 1, 30)), failed(cause="provider", at=at(10, 5))]
    forward = decide(run(events=events, usage=[s1, s2]))
    backward = decide(run(events=[*events[::-1], events[0]], usage=[s2, s1, s2, s1]))
    assert forward == backward


def test_reads_times_in_utc_whatever_their_offset() -> None:
    plus_two = timezone(timedelta(hours=2))
    local = datetime(2025, 3, 3, 12, 42, tzinfo=plus_two)
    decision = decide(
        run(events=[lost(side="server", at=local)], usage=[line(step=1, micros=1, at=local)])
    )
    assert "at 10:42" in decision.explanation


def test_refuses_to_settle_an_unfinished_run_that_is_not_abandoned() -> None:
    with pytest.raises(ValueError, match="abandoned"):
        decide(run(events=[heartbeat(at=at(10))], abandoned=False))


def test_refuses_negative_usage() -> None:
    with pytest.raises(ValueError, match="negative"):
        line(step=1, micros=-1, at=at(10))
