"""``fairmeter simulate``: send simulated agent runs and check how the server settles them."""

from __future__ import annotations

import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def _rate(name: str, default: float, help_text: str) -> Callable[[F], F]:
    return click.option(
        f"--{name}-rate",
        default=default,
        show_default=True,
        type=click.FloatRange(0, 1),
        help=help_text,
    )


@click.command("simulate")
@click.option("--runs", default=100, show_default=True, type=click.IntRange(0))
@click.option("--customers", default=10, show_default=True, type=click.IntRange(1))
@click.option("--seed", default=1, show_default=True, type=int)
@_rate("interrupt", 0.35, "Runs with drops, resumes or failures.")
@_rate("cancel", 0.08, "Runs cancelled (by the user, or by the system).")
@_rate("abandon", 0.06, "Runs that stop reporting (no terminal event).")
@_rate("duplicate", 0.10, "Clean runs that re-execute a completed tool call.")
@click.option("--api", "api_url", default="http://127.0.0.1:8000", show_default=True)
@click.option("--key", required=True, help="An ingest key of the tenant to simulate in.")
@click.option("--support-key", default=None, help="A support key (for --settle-now).")
@click.option(
    "--settle-now",
    is_flag=True,
    help="Settle each run through the support API instead of waiting for the worker.",
)
@click.option("--timeout", "timeout_s", default=300.0, show_default=True, help="Seconds.")
@click.option(
    "--anchor",
    type=click.DateTime(),
    default=None,
    help="The simulation's 'now' (UTC); with the seed it fixes every event. Default: now.",
)
@click.option("--prefix", default=None, help="Run id prefix. Default: sim<seed>-<anchor>.")
@click.option(
    "--customer",
    "customer_ids",
    multiple=True,
    help="Customer ids to use (repeatable). Default: --customers fresh ids.",
)
@click.option(
    "--prices",
    "prices_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="The catalog CSV the server prices with (as for `prices load`). Default: the sample.",
)
@click.option("--progress/--no-progress", default=None, help="Default: on a terminal.")
def simulate(
    runs: int,
    customers: int,
    seed: int,
    interrupt_rate: float,
    cancel_rate: float,
    abandon_rate: float,
    duplicate_rate: float,
    api_url: str,
    key: str,
    support_key: str | None,
    settle_now: bool,
    timeout_s: float,
    anchor: datetime | None,
    prefix: str | None,
    customer_ids: tuple[str, ...],
    prices_file: Path | None,
    progress: bool | None,
) -> None:
    """Send simulated agent runs through the client and check every settlement.

    Each run's expected decision comes from the settlement policy applied to the events the
    simulator generated. Exits 1 when any run settles otherwise (or not at all), or when the
    server refuses an event.
    """
    if settle_now and not support_key:
        raise click.UsageError("--settle-now needs --support-key")
    # Imported here: `fairmeter serve` and the other commands need none of this.
    from fairmeter_client import MeterConfigError

    from devtools.simulator.plan import Timing, TrafficSpec, default_customers, default_run_prefix
    from devtools.simulator.scenarios import Rates
    from devtools.simulator.simulation import SimulationConfig
    from devtools.simulator.simulation import simulate as run_simulation
    from metering.config import load_settings
    from metering.errors import MeteringError
    from metering.prices import read_catalog_file
    from metering.settlement.settle import policy_config

    settings = load_settings()
    moment = (anchor or datetime.now(UTC)).replace(microsecond=0)
    moment = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment
    run_prefix = prefix or default_run_prefix(seed, moment)
    try:
        prices = read_catalog_file(prices_file) if prices_file else None
    except MeteringError as exc:
        raise click.BadParameter(str(exc), param_hint="--prices") from exc
    try:
        rates = Rates(interrupt_rate, cancel_rate, abandon_rate, duplicate_rate)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    spec = TrafficSpec(
        seed=seed,
        runs=runs,
        customers=list(customer_ids) or default_customers(customers, run_prefix),
        anchor=moment,
        run_prefix=run_prefix,
        rates=rates,
        timing=Timing.for_windows(
            settle_grace_s=settings.settle_grace_s, idle_timeout_s=settings.idle_timeout_s
        ),
    )
    config = SimulationConfig(
        spec=spec,
        api_url=api_url.rstrip("/"),
        key=key,
        support_key=support_key,
        settle_now=settle_now,
        settle_timeout_s=timeout_s,
        progress=sys.stderr.isatty() if progress is None else progress,
        policy=policy_config(settings),
        prices=prices,
    )
    try:
        report = run_simulation(config)
    except MeterConfigError as exc:
        message = f"the API refused the client (check --api and --key): {exc}"
        raise click.ClickException(message) from exc
    click.echo(report.render())
    sys.exit(report.exit_code)
