"""One simulation: plan, send through the client, settle, compare."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from devtools.simulator.plan import PlannedRun, TrafficSpec, plan_traffic
from devtools.simulator.report import SimulationReport, compare
from devtools.simulator.send import Checkpoint, Delivery, no_checkpoint, send_traffic, settle_now
from devtools.simulator.wait import wait_for_settlement
from metering.policy import PolicyConfig
from metering.prices import read_catalog_file
from metering.pricing import Price, PriceCatalog


@dataclass(frozen=True)
class SimulationConfig:
    spec: TrafficSpec
    api_url: str
    key: str  # an ingest key (it may read runs too)
    support_key: str | None = None  # for settle_now
    settle_now: bool = False
    send_timeout_s: float = 120.0
    settle_timeout_s: float = 300.0
    progress: bool = True
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    prices: Sequence[Price] | None = None  # the sample catalog by default


def simulate(config: SimulationConfig, checkpoint: Checkpoint = no_checkpoint) -> SimulationReport:
    """Plan, send, settle, compare. ``checkpoint`` is called often and may raise to stop."""
    spec = config.spec
    if config.settle_now and not config.support_key:
        raise ValueError("settling now needs a support key")
    catalog = PriceCatalog.from_prices(config.prices or read_catalog_file())
    planned: list[PlannedRun] = plan_traffic(spec, catalog, config.policy)
    started = time.monotonic()
    delivery = send_traffic(
        config.api_url,
        config.key,
        planned,
        source=spec.source,
        timeout_s=config.send_timeout_s,
        progress=config.progress,
        checkpoint=checkpoint,
    )
    delivery.elapsed_s = time.monotonic() - started
    refused: dict[str, str] = {}
    if delivery.undelivered:  # the API is unreachable: nothing to wait for
        return _report(config, planned, delivery, {}, refused)
    if config.settle_now and config.support_key:
        refused = settle_now(
            config.api_url,
            config.support_key,
            planned,
            progress=config.progress,
            checkpoint=checkpoint,
        )
    actual = wait_for_settlement(
        config.api_url,
        config.key,
        planned,
        timeout_s=config.settle_timeout_s,
        progress=config.progress,
        checkpoint=checkpoint,
    )
    report = _report(config, planned, delivery, actual, refused)
    report.settle_elapsed_s = time.monotonic() - started - delivery.elapsed_s
    return report


def _report(
    config: SimulationConfig,
    planned: list[PlannedRun],
    delivery: Delivery,
    actual: dict[str, dict[str, Any]],
    refused: dict[str, str],
) -> SimulationReport:
    customers = len({run.scenario.customer for run in planned})
    return SimulationReport(
        planned=planned,
        actual=actual,
        delivery=delivery,
        mismatches=compare(planned, actual),
        refused_settles=refused,
        description=(
            f"Simulated {len(planned)} runs for {customers} customers "
            f"(seed {config.spec.seed}, runs {config.spec.run_prefix}-*) against {config.api_url}."
        ),
    )
