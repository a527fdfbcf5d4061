"""``fairmeter support …``: scripted support work, as an admin of one tenant."""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import UTC, datetime
from decimal import Decimal

import click

from metering.config import load_cli_settings
from metering.db import create_db_engine, raw_transaction
from metering.disputes import service, timeline
from metering.keys import Principal, Scope
from metering.money import MICROS_PER_USD, format_usd
from metering.runs import find_run_id


def _operator(tenant: str) -> Principal:
    return Principal(tenant_id=tenant, scope=Scope.ADMIN, key_id="cli")


@click.group()
def support() -> None:
    """Support tooling for disputes and credits."""


@support.command("run")
@click.argument("run")
@click.option("--tenant", required=True)
def show_run(run: str, tenant: str) -> None:
    """Print a run's full timeline as JSON."""
    engine = create_db_engine(load_cli_settings())
    with raw_transaction(engine) as conn:
        found = timeline.timeline(conn, _operator(tenant), run)
    click.echo(json.dumps(asdict(found), default=str, indent=2))


@support.command("disputes")
@click.option("--tenant", required=True)
@click.option("--open", "only_open", is_flag=True, help="Only open disputes.")
def list_disputes(tenant: str, only_open: bool) -> None:
    """List disputes, newest first."""
    engine = create_db_engine(load_cli_settings())
    with raw_transaction(engine) as conn:
        found = timeline.disputes(conn, _operator(tenant), status="open" if only_open else None)
    for d in found:
        click.echo(f"{d.id}\t{d.status}\t{d.run}\t{d.customer_id}\t{d.claim}")
    click.echo(f"{len(found)} dispute(s)")


@support.command("credit")
@click.argument("run")
@click.option("--tenant", required=True)
@click.option("--amount", help="USD, e.g. 1.25", default=None)
@click.option("--percent", default=None, help="Percent of what the run bills, e.g. 12.5")
@click.option("--full", is_flag=True)
@click.option("--reason", required=True, help="Shown to the customer.")
def credit(
    run: str, tenant: str, amount: str | None, percent: str | None, full: bool, reason: str
) -> None:
    """Credit a run (through a new decision version, the ledger and the Stripe outbox)."""
    settings = load_cli_settings()
    micros = None
    if amount is not None:
        exact = Decimal(amount) * MICROS_PER_USD
        if exact != exact.to_integral_value():
            raise click.BadParameter("at most 6 decimals", param_hint="--amount")
        micros = int(exact)
    if sum([full, micros is not None, percent is not None]) != 1:
        raise click.UsageError("give exactly one of --amount, --percent or --full")
    engine = create_db_engine(settings)
    with raw_transaction(engine) as conn:
        operator = _operator(tenant)
        run_id = find_run_id(conn, operator, run)
        granted, version = service.grant_credit(
            conn,
            operator,
            run_id,
            service.Credit(full, micros, percent),
            reason=reason,
            settings=settings,
            now=datetime.now(UTC),
            action="run.credit",
        )
    click.echo(f"credited {format_usd(granted)} USD to {run} (decision version {version})")
