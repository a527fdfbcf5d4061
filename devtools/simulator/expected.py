"""What the server must decide for a simulated run, computed without the server.

The run's calls are turned into the exact CloudEvents the client will send (through the
client's own :class:`fairmeter_client.Run`, with a recorder that builds events instead of spooling
them), the usage events are priced with the catalog in force at their time, and the facts go
through the project's pure policy :func:`metering.policy.decide`. That checks the whole
pipeline end to end — client, ingest, pricing, ledger, sweeper, settlement, API — against the
policy on facts the simulator generated itself.

R8 (the protection cap) depends on a customer's other decisions in the period, so on the
order in which runs are settled. :func:`fresh_period` decisions ignore other runs; the plan
keeps each customer's automatic credits and refunds within :class:`CapBudget` (half the cap
by default), so the cap cannot fire in any settlement order and the fresh decision is the
right expectation — for customers that start the period without earlier automatic credits.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fairmeter_client import Run
from fairmeter_client.events import Draft, to_cloudevent

from devtools.simulator.scenarios import Scenario
from metering.policy import (
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
)
from metering.policy.timeline import ending_event
from metering.pricing import PriceCatalog, TokenCounts
from metering.timestamps import parse_rfc3339


class _Capture:
    """A ``Recorder`` for :class:`fairmeter_client.Run` that keeps the CloudEvents it is given."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.events: list[dict[str, Any]] = []

    def record(self, run: str, customer: str, draft: Draft) -> str:
        if draft.sequenced or draft.at is None:
            # Ids from the spool's sequence or times from the clock would not be reproducible.
            raise ValueError(f"simulated {draft.type} needs key= and at=")
        event = to_cloudevent(
            draft, source=self.source, run=run, customer=customer, seq=None, now=draft.at
        )
        self.events.append(event)
        return str(event["id"])


def apply_calls(run: Run, scenario: Scenario) -> list[str]:
    """Make the scenario's calls on ``run``; the event ids the client returned."""
    return [getattr(run, call.method)(**call.kwargs) for call in scenario.calls]


def cloudevents(scenario: Scenario, source: str) -> list[dict[str, Any]]:
    """The structured-mode CloudEvents the client sends for ``scenario``, in call order."""
    capture = _Capture(source)
    apply_calls(Run(capture, scenario.run_id, customer=scenario.customer), scenario)
    return capture.events


@dataclass(frozen=True)
class Expectation:
    """What the server's run view must show once settled: a held run bills and credits
    nothing yet, its whole gross is held (as the ledger and the statements have it)."""

    outcome: str
    status: str
    gross_micros: int
    billed_micros: int
    credited_micros: int
    held_micros: int
    rule_ids: tuple[str, ...]

    @classmethod
    def of(cls, decision: Decision) -> Expectation:
        held = decision.outcome == HELD_FOR_REVIEW
        return cls(
            decision.outcome,
            decision.status,
            decision.gross_micros,
            0 if held else decision.billed_micros,
            0 if held else decision.credited_micros,
            decision.gross_micros if held else 0,
            decision.rule_ids,
        )

    @property
    def automatic_credit_micros(self) -> int:
        """What counts towards R8: credits of decisions applied automatically."""
        automatic = self.outcome in (PARTIALLY_CREDITED, REFUNDED)
        return self.credited_micros if automatic else 0


def _time(event: dict[str, Any]) -> datetime:
    moment = parse_rfc3339(str(event["time"]))
    assert moment is not None, event["time"]
    return moment


def run_facts(
    events: Iterable[dict[str, Any]], catalog: PriceCatalog, first_line_id: int = 1
) -> RunFacts:
    """The policy's facts of one run, as settlement loads them from the database.

    Event ids read ``source/id`` like the stored ones. ``line_id`` follows the send order,
    as the database's sequence does; it only breaks ties of equal times, which the
    generator never produces within a run.
    """
    facts: list[EventFact] = []
    lines: list[UsageLine] = []
    for event in events:
        event_id, at, data = f"{event['source']}/{event['id']}", _time(event), event["data"]
        facts.append(EventFact(event_id, str(event["type"]), at, data))
        if event["type"] != "run.usage":
            continue
        tokens = TokenCounts(
            data["input_tokens"], data.get("cached_input_tokens", 0), data["output_tokens"]
        )
        priced = catalog.price_usage(str(data["model"]), tokens, at)
        lines.append(
            UsageLine(
                line_id=first_line_id + len(lines),
                event_id=event_id,
                step=int(data["step"]),
                attempt=int(data["attempt"]),
                tool_call_id=data.get("tool_call_id"),
                replay=bool(data.get("replay", False)),
                gross_micros=priced.total_micros,
                time=at,
            )
        )
    abandoned = ending_event(facts) is None
    return RunFacts(events=tuple(facts), usage=tuple(lines), abandoned=abandoned)


def fresh_period(facts: RunFacts) -> RunFacts:
    """The facts of a customer's only run in the period (no other decisions count for R8)."""
    gross = sum(line.gross_micros for line in facts.usage)
    return RunFacts(
        facts.events, facts.usage, facts.abandoned, CustomerPeriod(period_gross_micros=gross)
    )


def expect(facts: RunFacts, config: PolicyConfig) -> Expectation:
    return Expectation.of(decide(fresh_period(facts), config))


@dataclass
class CapBudget:
    """A customer's share of the protection cap the simulation may use (R8 stays silent)."""

    credit_micros: int
    refunded_runs: int

    @classmethod
    def half_of(cls, config: PolicyConfig) -> CapBudget:
        # Strictly within the cap in any order: R8 needs credits above the floor or refunds
        # above cap_runs. Half leaves room for a customer's earlier runs in the period.
        return cls(config.cap_floor_micros // 2, config.cap_runs // 2)

    def take(self, expected: Expectation) -> bool:
        """Reserve what ``expected`` credits automatically; False (nothing taken) if over."""
        credit = expected.automatic_credit_micros
        refund = 1 if expected.outcome == REFUNDED else 0
        if credit > self.credit_micros or refund > self.refunded_runs:
            return False
        self.credit_micros -= credit
        self.refunded_runs -= refund
        return True
