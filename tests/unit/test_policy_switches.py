"""The policy document's rule switches and knobs, as ``decide`` honours them (issue #17).

A switched-off rule credits nothing and is not cited as evidence; everything else about the
run is decided as before. The default document decides exactly as ``PolicyConfig()``.
"""

from __future__ import annotations

from metering.policy import (
    CONFIRMED,
    HELD_FOR_REVIEW,
    PARTIALLY_CREDITED,
    REFUNDED,
    Decision,
    RunFacts,
    decide,
    status,
)
from metering.policy.document import parse_policy
from tests.unit.policy_factories import (
    at,
    checkpoint,
    completed,
    delivered,
    failed,
    line,
    lost,
    period,
    resumed,
    run,
    started,
    tool_call,
)


def decide_under(facts: RunFacts, **document: object) -> Decision:
    return decide(facts, parse_policy(document).config())


def rules(**switches: object) -> dict[str, object]:
    return {"rules": switches}


def duplicate_tool_call_run() -> RunFacts:
    return run(
        events=[tool_call(tool_call_id="tc-1", step=1, at=at(10, 2)), completed(at=at(10, 9))],
        usage=[
            line(step=1, micros=300_000, at=at(10, 1), tool_call_id="tc-1"),
            line(step=2, micros=200_000, at=at(10, 3), tool_call_id="tc-1"),
        ],
    )


def replay_run() -> RunFacts:
    return run(
        events=[started(at=at(10)), resumed(attempt=2, at=at(10, 5)), completed(at=at(10, 9))],
        usage=[
            line(step=1, micros=400_000, at=at(10, 1)),
            line(step=1, micros=100_000, at=at(10, 6), attempt=2, replay=True),
        ],
    )


def lost_work_run() -> RunFacts:
    return run(
        events=[
            checkpoint(step=1, at=at(10, 2)),
            lost(side="server", at=at(10, 4)),
            resumed(attempt=2, at=at(10, 5), from_checkpoint="cp-1"),
            completed(at=at(10, 9)),
        ],
        usage=[
            line(step=1, micros=100_000, at=at(10, 1)),
            line(step=2, micros=250_000, at=at(10, 3)),
            line(step=2, micros=250_000, at=at(10, 6), attempt=2),
        ],
    )


def server_drop_run(*, micros: int = 1_420_000, delivered_step: int | None = None) -> RunFacts:
    events = [lost(side="server", at=at(10, 42)), failed(cause="unknown", at=at(10, 44))]
    if delivered_step is not None:
        events.append(delivered(step=delivered_step, at=at(10, 20)))
    usage = [line(step=1, micros=micros // 2, at=at(10, 10))]
    usage.append(line(step=2, micros=micros - micros // 2, at=at(10, 30)))
    return run(events=events, usage=usage)


def unverified_failure_run(*, micros: int) -> RunFacts:
    return run(
        events=[lost(side="client", at=at(10, 41)), failed(cause="client", at=at(10, 42))],
        usage=[line(step=1, micros=micros, at=at(10, 40))],
    )


def test_an_empty_document_decides_as_the_built_in_policy() -> None:
    for facts in (duplicate_tool_call_run(), replay_run(), lost_work_run(), server_drop_run()):
        assert decide_under(facts) == decide(facts)


def test_r1_off_bills_a_repeated_tool_call() -> None:
    facts = duplicate_tool_call_run()
    assert decide(facts).rule_ids == ("R1",)
    decision = decide_under(facts, **rules(R1=False))
    assert (decision.outcome, decision.billed_micros, decision.credited_micros) == (
        CONFIRMED,
        500_000,
        0,
    )
    assert decision.rule_ids == ("R0",)
    assert len(decision.evidence_event_ids) == 1  # the completion, not the tool call


def test_r2_off_bills_replayed_context() -> None:
    decision = decide_under(replay_run(), **rules(R2=False))
    assert (decision.outcome, decision.credited_micros, decision.rule_ids) == (
        CONFIRMED,
        0,
        ("R0",),
    )
    assert decide_under(replay_run(), **rules(R1=False, R3=False)).rule_ids == ("R2",)


def test_r3_off_bills_the_lost_copy_of_redone_work() -> None:
    facts = lost_work_run()
    assert decide(facts).credited_micros == 250_000
    decision = decide_under(facts, **rules(R3=False))
    assert (decision.outcome, decision.billed_micros, decision.rule_ids) == (
        CONFIRMED,
        600_000,
        ("R0",),
    )
    assert "lost" not in decision.explanation


def test_r4_off_bills_an_interrupted_run_without_output_and_cites_only_its_end() -> None:
    facts = server_drop_run()
    assert decide(facts).outcome == REFUNDED
    decision = decide_under(facts, **rules(R4=False))
    assert (decision.outcome, decision.billed_micros, decision.rule_ids) == (
        CONFIRMED,
        1_420_000,
        ("R0",),
    )
    terminal = next(e for e in facts.events if e.type == "run.failed")
    assert decision.evidence_event_ids == (terminal.event_id,)
    assert decision.status == status.FAILED_CHARGED
    assert decision.explanation == (
        "The connection dropped on our side at 10:42; this platform's policy does not credit "
        "interrupted runs. All 1.42 USD of usage was billed."
    )


def test_r4_off_leaves_partial_credit_on() -> None:
    decision = decide_under(server_drop_run(delivered_step=1), **rules(R4=False))
    assert (decision.outcome, decision.rule_ids) == (PARTIALLY_CREDITED, ("R5",))


def test_r5_off_bills_undelivered_work_of_an_interrupted_run() -> None:
    facts = server_drop_run(delivered_step=1)
    assert decide(facts).outcome == PARTIALLY_CREDITED
    decision = decide_under(facts, **rules(R5=False))
    assert (decision.outcome, decision.credited_micros, decision.rule_ids) == (
        CONFIRMED,
        0,
        ("R0",),
    )
    assert decide_under(server_drop_run(), **rules(R5=False)).outcome == REFUNDED


def test_abandoned_run_with_r4_off_is_billed_with_words_for_it() -> None:
    facts = run(
        events=[lost(side="server", at=at(10, 42))],
        usage=[line(step=1, micros=1_000_000, at=at(10, 30))],
    )
    decision = decide_under(facts, **rules(R4=False))
    assert (decision.outcome, decision.evidence_event_ids) == (CONFIRMED, ())
    assert decision.status == status.FAILED_CHARGED
    assert decision.explanation.startswith("The connection dropped on our side at 10:42;")


def test_r7_holds_by_default() -> None:
    decision = decide(unverified_failure_run(micros=900_000))
    assert (decision.outcome, decision.rule_ids) == (HELD_FOR_REVIEW, ("R7",))


def test_r7_auto_refund_refunds_a_run_below_the_amount() -> None:
    r7 = {"action": "auto_refund", "under_micros": 1_000_000}
    decision = decide_under(unverified_failure_run(micros=990_000), **rules(R7=r7))
    assert (decision.outcome, decision.rule_ids, decision.credited_micros) == (
        REFUNDED,
        ("R7",),
        990_000,
    )
    assert decision.status == status.FAILED_RESTORED
    assert decision.explanation == (
        "The run failed at 10:42 with a cause reported by your app, and our systems saw no "
        "interruption. This platform refunds such runs under 1.00 USD without review; "
        "the full 0.99 USD was restored."
    )


def test_r7_auto_refund_still_holds_a_run_at_or_above_the_amount() -> None:
    r7 = {"action": "auto_refund", "under_micros": 1_000_000}
    decision = decide_under(unverified_failure_run(micros=1_000_000), **rules(R7=r7))
    assert (decision.outcome, decision.rule_ids) == (HELD_FOR_REVIEW, ("R7",))
    assert decide_under(unverified_failure_run(micros=999_999), **rules(R7=r7)).outcome == (
        REFUNDED
    )


def test_r7_auto_refund_is_still_under_the_protection_cap() -> None:
    r7 = {"action": "auto_refund", "under_micros": 1_000_000}
    facts = unverified_failure_run(micros=500_000)
    capped = RunFacts(
        events=facts.events,
        usage=facts.usage,
        period=period(gross_micros=1_000_000, refunded_runs=0),
    )
    decision = decide_under(capped, cap_floor_micros=0, cap_fraction_ppm=100_000, **rules(R7=r7))
    assert (decision.outcome, decision.rule_ids) == (HELD_FOR_REVIEW, ("R7", "R8"))
    assert "above the 0.10 USD limit" in decision.explanation


def test_r8_off_never_holds_for_the_cap() -> None:
    facts = RunFacts(
        events=server_drop_run().events,
        usage=server_drop_run(micros=2_000_000).usage,
        period=period(gross_micros=2_000_000, credited_micros=10_000_000, refunded_runs=99),
    )
    assert decide(facts).outcome == HELD_FOR_REVIEW
    decision = decide_under(facts, **rules(R8=False))
    assert (decision.outcome, decision.rule_ids) == (REFUNDED, ("R4",))


def test_cap_fraction_knob() -> None:
    facts = RunFacts(
        events=server_drop_run().events,
        usage=server_drop_run(micros=1_000_000).usage,
        period=period(gross_micros=10_000_000),
    )
    assert decide_under(facts, cap_floor_micros=0, cap_fraction_ppm=100_000).outcome == REFUNDED
    held = decide_under(facts, cap_floor_micros=0, cap_fraction_ppm=99_999)
    assert held.outcome == HELD_FOR_REVIEW


def test_cap_floor_knob() -> None:
    facts = RunFacts(
        events=server_drop_run().events,
        usage=server_drop_run(micros=1_000_000).usage,
        period=period(gross_micros=1_000_000),
    )
    assert decide_under(facts, cap_fraction_ppm=0, cap_floor_micros=1_000_000).outcome == REFUNDED
    held = decide_under(facts, cap_fraction_ppm=0, cap_floor_micros=999_999)
    assert held.outcome == HELD_FOR_REVIEW


def test_cap_runs_knob() -> None:
    facts = RunFacts(
        events=server_drop_run().events,
        usage=server_drop_run(micros=10_000).usage,
        period=period(refunded_runs=3),
    )
    assert decide_under(facts, cap_runs=4).outcome == REFUNDED
    assert decide_under(facts, cap_runs=3).outcome == HELD_FOR_REVIEW
