"""Running a deployment: the price and provider-cost catalogs, the schema, the API server,
a settlement sweep."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from metering.config import WeakPepperError, load_cli_settings, require_strong_pepper
from metering.db import create_db_engine, raw_transaction

if TYPE_CHECKING:
    from metering.prices import CatalogKind


@click.group()
def prices() -> None:
    """Manage the price catalog."""


@prices.command("load")
@click.argument(
    "file", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=False
)
def prices_load(file: Path | None) -> None:
    """Load a catalog CSV (model,token_class,micros_per_mtok,effective_from); default: sample."""
    from metering.prices import PRICES

    _load_catalog(file, PRICES)


@click.group()
def costs() -> None:
    """Manage the provider-cost catalog (what each model costs the platform)."""


@costs.command("load")
@click.argument(
    "file", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=False
)
def costs_load(file: Path | None) -> None:
    """Load a provider-cost CSV, same shape as prices; default: the shipped sample."""
    from metering.prices import PROVIDER_COSTS

    _load_catalog(file, PROVIDER_COSTS)


def _load_catalog(file: Path | None, kind: CatalogKind) -> None:
    from metering.prices import insert_prices, read_catalog_file

    rows = read_catalog_file(file, kind)
    engine = create_db_engine(load_cli_settings())
    with raw_transaction(engine) as conn:
        added = insert_prices(conn, rows, kind)
    click.echo(f"{added} {kind.noun}(s) added, {len(rows) - added} already present")


@click.group()
def db() -> None:
    """Database schema."""


@db.command("upgrade")
@click.argument("revision", default="head")
def db_upgrade(revision: str) -> None:
    """Apply migrations up to REVISION (default: head)."""
    from metering.migrate import upgrade

    upgrade(load_cli_settings().database_url, revision)
    click.echo(f"database at {revision}")


@click.command()
@click.option("--host", default="127.0.0.1")
@click.option("--port", default=8000, type=int)
@click.option("--workers", default=1, type=int)
def serve(host: str, port: int, workers: int) -> None:
    """Run the API with uvicorn (never with a default, placeholder or short key pepper)."""
    from api.server import run_api

    settings = load_cli_settings()
    try:
        require_strong_pepper(settings)
    except WeakPepperError as exc:
        click.echo(f"fairmeter serve: {exc}", err=True)
        sys.exit(2)
    run_api(settings, host=host, port=port, workers=workers)


@click.command()
@click.option("--due", is_flag=True, required=True, help="Settle every run that is due now.")
def settle(due: bool) -> None:
    """Run a settlement sweep in this process (what the beat-driven workers do)."""
    from metering.settlement.runner import settle_due_now

    settings = load_cli_settings()
    report = settle_due_now(create_db_engine(settings), settings)
    click.echo(
        f"{len(report.decided)} run(s) decided, {len(report.unchanged)} unchanged, "
        f"{len(report.not_due)} no longer due"
    )
