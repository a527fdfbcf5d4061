"""The traffic of one simulation: runs, their CloudEvents and expected decisions (pure).

Same :class:`TrafficSpec` → same traffic: every run draws from its own generator seeded by
``(seed, index)``, and all times are offsets from ``spec.anchor``.

Times (docs/policy.md windows, see :class:`Timing`): runs with a terminal event end between
``recent_span_s`` and ``min_age_s`` before the anchor (``min_age_s`` > the settle grace, so
they are due once sent, and their events are younger than the idle timeout, so a run is not
settled as abandoned while only part of it has arrived); abandoned runs go quiet more than
``idle_timeout_s`` before the anchor, so they are due once sent too. Nothing is older than
the 35 days ingest accepts.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from devtools.simulator.expected import CapBudget, Expectation, cloudevents, expect, run_facts
from devtools.simulator.scenarios import (
    ABANDONED_KINDS,
    Kind,
    Rates,
    Scenario,
    build_scenario,
    choose_kind,
)
from metering.policy import PolicyConfig
from metering.pricing import PriceCatalog

DEFAULT_SOURCE = "agent-backend/simulator"
MAX_AGE_S = 30 * 24 * 3600  # ingest accepts 35 days; keep a margin


@dataclass(frozen=True)
class Timing:
    min_age_s: int = 300  # > the settle grace (120 s)
    recent_span_s: int = 2700  # terminal runs end within the last 45 minutes …
    idle_timeout_s: int = 3600  # … abandoned ones went quiet before this

    @classmethod
    def for_windows(cls, *, settle_grace_s: int, idle_timeout_s: int) -> Timing:
        """Times that have the server's windows behind them once the traffic is sent."""
        min_age_s = settle_grace_s + 180
        recent_span_s = max(min_age_s, min(2700, idle_timeout_s * 3 // 4))
        return cls(min_age_s, recent_span_s, idle_timeout_s)


@dataclass(frozen=True)
class TrafficSpec:
    seed: int
    runs: int
    customers: Sequence[str]
    anchor: datetime  # "now" of the simulation; every time is before it
    run_prefix: str
    rates: Rates = field(default_factory=Rates)
    source: str = DEFAULT_SOURCE
    timing: Timing = field(default_factory=Timing)

    def __post_init__(self) -> None:
        if self.runs < 0 or not self.customers:
            raise ValueError("need runs ≥ 0 and at least one customer")
        if self.anchor.tzinfo is None:
            raise ValueError("the anchor must be timezone-aware")
        if self.timing.idle_timeout_s + 2 * 3600 > MAX_AGE_S:
            raise ValueError("the idle timeout is too long to simulate abandoned runs")


@dataclass(frozen=True)
class PlannedRun:
    index: int
    scenario: Scenario
    events: tuple[dict[str, Any], ...]  # exactly what the client will send
    expected: Expectation
    capped: bool = False  # turned into a clean run to keep the customer under the cap

    @property
    def run_id(self) -> str:
        return self.scenario.run_id

    @property
    def ended_at(self) -> datetime:
        return self.scenario.ended_at


def _end_time(spec: TrafficSpec, kind: Kind, rng: random.Random) -> datetime:
    timing = spec.timing
    if kind in ABANDONED_KINDS:
        quiet_s = timing.idle_timeout_s + 300 + rng.randint(0, 3600)
        return spec.anchor - timedelta(seconds=quiet_s)
    oldest_s = max(timing.min_age_s, timing.recent_span_s)
    age_ms = rng.randint(timing.min_age_s * 1000, oldest_s * 1000)
    return spec.anchor - timedelta(milliseconds=age_ms)


def _plan_run(
    spec: TrafficSpec,
    index: int,
    kind: Kind | None,
    catalog: PriceCatalog,
    config: PolicyConfig,
    salt: str = "",
) -> PlannedRun:
    rng = random.Random(f"fairmeter-simulator/{spec.seed}/{index}{salt}")
    chosen = choose_kind(rng, spec.rates) if kind is None else kind
    run_id = f"{spec.run_prefix}-{index:05d}"
    customer = spec.customers[index % len(spec.customers)]
    scenario = build_scenario(chosen, run_id, customer, rng, ends_at=_end_time(spec, chosen, rng))
    events = tuple(cloudevents(scenario, spec.source))
    expected = expect(run_facts(events, catalog), config)
    return PlannedRun(index, scenario, events, expected, capped=bool(salt))


def plan_traffic(
    spec: TrafficSpec, catalog: PriceCatalog, config: PolicyConfig
) -> list[PlannedRun]:
    """Every run of the simulation, with the decision the server must reach.

    A run whose automatic credit would exceed its customer's :class:`CapBudget` is
    generated again as a clean completed run (``capped``), so R8 never depends on the
    order the server settles runs in.
    """
    budgets = {customer: CapBudget.half_of(config) for customer in spec.customers}
    planned = []
    for index in range(spec.runs):
        run = _plan_run(spec, index, None, catalog, config)
        if not budgets[run.scenario.customer].take(run.expected):
            run = _plan_run(spec, index, Kind.COMPLETED, catalog, config, salt="/capped")
        planned.append(run)
    return planned


def default_run_prefix(seed: int, anchor: datetime) -> str:
    """Run ids unique per (seed, anchor second): a rerun never collides with earlier runs."""
    return f"sim{seed}-{anchor:%Y%m%dT%H%M%S}"


def default_customers(count: int, run_prefix: str) -> list[str]:
    """Customers of their own, so no earlier automatic credit counts towards their cap."""
    return [f"{run_prefix}-c{number:02d}" for number in range(1, count + 1)]
