"""Invariants of the settlement policy over realistic generated runs (docs/policy.md)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from typing import Any
from zoneinfo import ZoneInfo

from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec.structs import replace

from metering.policy import (
    CONFIRMED,
    HELD_FOR_REVIEW,
    PARTIALLY_CREDITED,
    REFUNDED,
    CustomerPeriod,
    Decision,
    EventFact,
    PolicyConfig,
    RunFacts,
    UsageLine,
    decide,
    status,
)
from tests.unit.policy_factories import DAY, ROOMY

START = DAY.replace(hour=9)
FAST = settings(max_examples=200, deadline=None)
SERVER_CAUSES = ("network", "server", "provider")
TERMINALS: tuple[tuple[str, dict[str, str]] | None, ...] = (
    None,  # abandoned
    ("run.completed", {}),
    ("run.cancelled", {"by": "user"}),
    ("run.cancelled", {"by": "system"}),
    *(("run.failed", {"cause": cause}) for cause in (*SERVER_CAUSES, "tool", "client", "unknown")),
)
NO_CAP = PolicyConfig(cap_fraction_ppm=10**6, cap_floor_micros=10**15, cap_runs=10**6)


@dataclass
class RunBuilder:
    """Writes one run's events and usage lines along a clock that only moves forward."""

    draw: Any
    now: datetime = START
    events: list[EventFact] = field(default_factory=list)
    lines: list[UsageLine] = field(default_factory=list)

    def tick(self) -> datetime:
        self.now += timedelta(seconds=self.draw(st.integers(0, 240)))  # 0 s: ties happen
        return self.now

    def add(self, type_: str, **data: Any) -> None:
        self.events.append(EventFact(f"e{len(self.events)}", type_, self.tick(), data))

    def use(self, *, step: int, attempt: int, tool_call_id: str | None, replay: bool) -> None:
        micros = self.draw(st.integers(0, 3_000_000))
        number = len(self.lines) + 1
        self.lines.append(
            UsageLine(
                number, f"u{number}", step, attempt, tool_call_id, replay, micros, self.tick()
            )
        )


def work(run: RunBuilder, *, attempt: int, first_step: int, saved: int | None) -> int | None:
    """Steps of one attempt: usage, tool calls, checkpoints, deliveries. Returns the saved step."""
    step = first_step
    for _ in range(run.draw(st.integers(0, 4))):
        step += 1
        # Deterministic tool-call ids per step, so redone steps repeat their tool calls.
        tool = f"tc-{step}" if run.draw(st.booleans()) else None
        if run.draw(st.integers(0, 5)) == 0:
            tool = f"tc-{run.draw(st.integers(1, step))}"  # an agent repeating an old call
        run.use(step=step, attempt=attempt, tool_call_id=tool, replay=False)
        if tool is not None and run.draw(st.booleans()):
            status_ = run.draw(st.sampled_from(["completed", "completed", "failed"]))
            run.add("run.tool_call", tool_call_id=tool, step=step, status=status_)
        if run.draw(st.integers(0, 2)) == 0:
            run.add("run.checkpoint", checkpoint_id=f"cp-{attempt}-{step}", step=step)
            saved = step
        if run.draw(st.integers(0, 4)) == 0:
            run.add("run.delivered", step=step, kind="partial")
    return saved


def interrupt(run: RunBuilder) -> None:
    side = run.draw(st.sampled_from(["server", "client", None]))
    if side is not None:
        run.add("connection.lost", side=side, reason="generated")
        if run.draw(st.booleans()):
            run.add("connection.restored", side=side)


@st.composite
def customer_periods(draw: Any) -> CustomerPeriod:
    return CustomerPeriod(
        period_gross_micros=draw(st.integers(0, 100_000_000)),
        auto_credited_micros=draw(st.integers(0, 20_000_000)),
        auto_refunded_runs=draw(st.integers(0, 25)),
    )


@st.composite
def runs(draw: Any, *, period: st.SearchStrategy[CustomerPeriod] | None = None) -> RunFacts:
    """Realistic runs: attempts, steps, checkpoints, drops on either side, resumes,
    replayed context, deliveries, and any terminal event or none."""
    run = RunBuilder(draw)
    run.add("run.started", attempt=1)
    saved = work(run, attempt=1, first_step=0, saved=None)
    for attempt in range(2, draw(st.integers(1, 3)) + 1):
        interrupt(run)
        run.add("run.resumed", attempt=attempt, from_checkpoint=f"cp-{saved}")
        first_step = saved or 0
        for _ in range(draw(st.integers(0, 2))):
            run.use(step=first_step, attempt=attempt, tool_call_id=None, replay=True)
        saved = work(run, attempt=attempt, first_step=first_step, saved=saved)
    if draw(st.booleans()):
        interrupt(run)
    terminal = draw(st.sampled_from(TERMINALS))
    if terminal is not None:
        run.add(terminal[0], **terminal[1])
    elif draw(st.booleans()):
        run.add("run.heartbeat")
    return RunFacts(
        events=tuple(run.events),
        usage=tuple(run.lines),
        abandoned=terminal is None,
        period=draw(period if period is not None else customer_periods()),
    )


def replayed_or_repeated(facts: RunFacts) -> set[int]:
    """A superset of what R1 and R2 may credit, computed independently of the policy:
    replayed calls in a resumed attempt, and every usage of a tool call but its first."""
    resumes = [e.time for e in facts.events if e.type == "run.resumed"]
    lines = sorted(facts.usage, key=lambda u: (u.time, u.line_id))
    found = {
        u.line_id
        for u in lines
        if u.replay and (u.attempt > 1 or any(t <= u.time for t in resumes))
    }
    seen: set[str] = set()
    for u in lines:
        if u.tool_call_id is not None:
            if u.tool_call_id in seen:
                found.add(u.line_id)
            seen.add(u.tool_call_id)
    return found


def without_server_evidence(facts: RunFacts) -> RunFacts:
    """The same run as claimed by the client only: our side saw nothing."""

    def client_side(event: EventFact) -> EventFact:
        if event.type in ("connection.lost", "connection.restored"):
            return replace(event, data={**event.data, "side": "client"})
        if event.type == "run.failed" and event.data["cause"] in SERVER_CAUSES:
            return replace(event, data={"cause": "client"})
        if event.type == "run.cancelled" and event.data["by"] == "system":
            return replace(event, type="run.failed", data={"cause": "client"})
        return event

    return replace(facts, events=tuple(client_side(e) for e in facts.events))


def line_sum(facts: RunFacts, line_ids: tuple[int, ...]) -> int:
    by_id = {u.line_id: u.gross_micros for u in facts.usage}
    return sum(by_id[i] for i in line_ids)


@FAST
@given(runs())
def test_billed_plus_credited_equals_gross_and_nothing_is_negative(facts: RunFacts) -> None:
    decision = decide(facts)
    assert decision.gross_micros == sum(u.gross_micros for u in facts.usage)
    assert decision.billed_micros + decision.credited_micros == decision.gross_micros
    assert min(decision.billed_micros, decision.credited_micros) >= 0
    assert decision.credited_micros == line_sum(facts, decision.credited_line_ids)


@FAST
@given(runs(period=customer_periods()))
def test_a_decision_without_words_differs_only_in_its_words(facts: RunFacts) -> None:
    # What-if decides a whole period with explained=False: the amounts, lines, rules and
    # evidence must be exactly those of the explained decision.
    explained, bare = decide(facts), decide(facts, explained=False)
    assert (bare.explanation, bare.story) == ("", "")
    assert replace(bare, explanation=explained.explanation, story=explained.story) == explained


@FAST
@given(runs())
def test_ids_are_sorted_unique_and_refer_to_the_run(facts: RunFacts) -> None:
    decision = decide(facts)
    known_lines = {u.line_id for u in facts.usage}
    known_events = {e.event_id for e in facts.events} | {u.event_id for u in facts.usage}
    lines, evidence = decision.credited_line_ids, decision.evidence_event_ids
    assert list(lines) == sorted(set(lines)) and set(lines) <= known_lines
    assert list(evidence) == sorted(set(evidence)) and set(evidence) <= known_events
    assert decision.rule_ids and list(decision.rule_ids) == sorted(set(decision.rule_ids))


@FAST
@given(runs())
def test_outcome_and_status_follow_the_amounts(facts: RunFacts) -> None:
    decision = decide(facts)
    if decision.outcome == HELD_FOR_REVIEW:
        assert decision.status == status.UNDER_REVIEW
        assert {"R7", "R8"} & set(decision.rule_ids)
        return
    expected = (
        CONFIRMED
        if decision.credited_micros == 0
        else REFUNDED
        if decision.billed_micros == 0
        else PARTIALLY_CREDITED
    )
    assert decision.outcome == expected
    assert decision.status != status.UNDER_REVIEW


@FAST
@given(runs(), st.randoms(use_true_random=False))
def test_decision_is_unchanged_when_events_and_lines_are_shuffled_or_duplicated(
    facts: RunFacts, rnd: random.Random
) -> None:
    events = [*facts.events, *rnd.choices(facts.events, k=rnd.randint(0, 5))]
    usage = [*facts.usage, *(rnd.choices(facts.usage, k=rnd.randint(0, 5)) if facts.usage else [])]
    rnd.shuffle(events)
    rnd.shuffle(usage)
    shuffled = replace(facts, events=tuple(events), usage=tuple(usage))
    assert decide(shuffled) == decide(facts)


@FAST
@given(runs(), st.integers(-12, 12))
def test_decision_is_unchanged_when_times_are_given_in_another_offset(
    facts: RunFacts, hours: int
) -> None:
    offset = timezone(timedelta(hours=hours))
    moved = replace(
        facts,
        events=tuple(replace(e, time=e.time.astimezone(offset)) for e in facts.events),
        usage=tuple(replace(u, time=u.time.astimezone(offset)) for u in facts.usage),
    )
    assert decide(moved) == decide(facts)


# Zones a stored or reported time may come in: UTC's own tzinfo (kept as it is by the
# policy), zero-offset zones that are not it (rebuilt), half-hour offsets, and naive UTC.
ZONES: tuple[tzinfo | None, ...] = (
    UTC,
    ZoneInfo("Etc/UTC"),
    ZoneInfo("Europe/London"),
    ZoneInfo("America/St_Johns"),
    ZoneInfo("Asia/Kathmandu"),
    timezone(timedelta(hours=-7)),
    None,
)


def in_zone(moment: datetime, zone: tzinfo | None) -> datetime:
    if zone is None:
        return moment.astimezone(UTC).replace(tzinfo=None)
    return moment.astimezone(zone)


@FAST
@given(runs(), st.randoms(use_true_random=False))
def test_decision_is_unchanged_when_each_time_comes_in_its_own_zone_or_naive(
    facts: RunFacts, rnd: random.Random
) -> None:
    # Mixed zones within one run: the UTC normalisation may skip a fact only when its own
    # time is UTC already, never because another fact's (or the first one's) is.
    moved = replace(
        facts,
        events=tuple(replace(e, time=in_zone(e.time, rnd.choice(ZONES))) for e in facts.events),
        usage=tuple(replace(u, time=in_zone(u.time, rnd.choice(ZONES))) for u in facts.usage),
    )
    assert decide(moved) == decide(facts)


def with_delivery(facts: RunFacts, step: int, minutes: int) -> RunFacts:
    moment = START + timedelta(minutes=minutes)
    shown = EventFact("extra-delivery", "run.delivered", moment, {"step": step, "kind": "final"})
    return replace(facts, events=(*facts.events, shown))


@FAST
@given(runs(period=st.just(ROOMY)), st.integers(0, 15), st.integers(0, 120))
def test_adding_a_delivery_never_increases_the_credit(
    facts: RunFacts, step: int, minutes: int
) -> None:
    # Stated where the cap does not bind: under R8 a smaller credit can fit the cap where a
    # larger one was held, so the credit of the final decision may then grow; see below.
    before = decide(facts)
    after = decide(with_delivery(facts, step, minutes))
    assert after.credited_micros <= before.credited_micros
    assert set(after.credited_line_ids) <= set(before.credited_line_ids)


@FAST
@given(runs(), st.integers(0, 15), st.integers(0, 120))
def test_adding_a_delivery_never_puts_an_automatic_decision_on_hold(
    facts: RunFacts, step: int, minutes: int
) -> None:
    before = decide(facts)
    after = decide(with_delivery(facts, step, minutes))
    if before.outcome != HELD_FOR_REVIEW:
        assert after.outcome != HELD_FOR_REVIEW


@FAST
@given(runs())
def test_client_only_claims_never_credit_beyond_replays_and_repeated_tool_calls(
    facts: RunFacts,
) -> None:
    """With no server-side evidence at all (no connection.lost side=server, no run.failed
    with cause network/server/provider, no run.cancelled by=system), the decision never
    applies R3, R4 or R5, and every credited line is a replayed call in a resumed attempt or
    a repeated use of a tool call id (the only lines R1 and R2 can name)."""
    claimed = without_server_evidence(facts)
    decision = decide(claimed)
    assert not {"R3", "R4", "R5"} & set(decision.rule_ids)
    assert set(decision.credited_line_ids) <= replayed_or_repeated(claimed)


@FAST
@given(runs())
def test_a_hold_never_credits_more_than_the_automatic_decision_would(facts: RunFacts) -> None:
    decision = decide(facts)
    if "R8" in decision.rule_ids:
        uncapped = decide(facts, NO_CAP)
        assert uncapped.outcome != HELD_FOR_REVIEW
        assert set(decision.credited_line_ids) <= set(uncapped.credited_line_ids)
        assert set(uncapped.rule_ids) == set(decision.rule_ids) - {"R8"}


@FAST
@given(runs())
def test_explanation_names_the_amounts_in_usd(facts: RunFacts) -> None:
    decision: Decision = decide(facts)
    assert decision.explanation.endswith(".")
    if decision.gross_micros and decision.outcome != HELD_FOR_REVIEW:
        assert " USD" in decision.explanation
