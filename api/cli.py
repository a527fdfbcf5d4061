"""The ``fairmeter`` command line."""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path

import click

from metering.config import WeakPepperError, load_settings, require_strong_pepper
from metering.db import create_db_engine, raw_transaction
from metering.errors import MeteringError
from metering.keys import Scope


@click.group()
def main() -> None:
    """Fairmeter: usage metering and billing protection for AI-agent runs."""


@main.group()
def keys() -> None:
    """Create and revoke API keys."""


@keys.command("create")
@click.option("--tenant", required=True, help="Tenant id (created when new).")
@click.option("--scope", type=click.Choice([s.value for s in Scope]), required=True)
@click.option("--customer", default=None, help="The customer a customer-scope key may read.")
@click.option("--label", default=None)
@click.option("--expires", type=click.DateTime(), default=None, help="Expiry (UTC).")
def keys_create(
    tenant: str, scope: str, customer: str | None, label: str | None, expires: datetime | None
) -> None:
    """Create a key and print its secret once (it is stored only as an HMAC)."""
    from metering.keys_repo import create_key

    settings = load_settings()
    engine = create_db_engine(settings)
    with raw_transaction(engine) as conn:
        key_id, raw = create_key(
            conn,
            tenant_id=tenant,
            scope=Scope(scope),
            pepper=settings.key_pepper,
            customer_id=customer,
            label=label,
            expires_at=expires.astimezone() if expires else None,
        )
    click.echo(f"key id: {key_id}", err=True)
    click.echo(raw)


@keys.command("revoke")
@click.argument("key_id")
def keys_revoke(key_id: str) -> None:
    """Revoke a key by id; API processes stop accepting it within the key cache TTL."""
    from metering.keys_repo import revoke_key

    engine = create_db_engine(load_settings())
    with raw_transaction(engine) as conn:
        revoke_key(conn, key_id)
    click.echo(f"revoked {key_id}")


@main.group()
def prices() -> None:
    """Manage the price catalog."""


@prices.command("load")
@click.argument(
    "file", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=False
)
def prices_load(file: Path | None) -> None:
    """Load a catalog CSV (model,token_class,micros_per_mtok,effective_from); default: sample."""
    from metering.prices import insert_prices, read_catalog_file

    rows = read_catalog_file(file)
    engine = create_db_engine(load_settings())
    with raw_transaction(engine) as conn:
        added = insert_prices(conn, rows)
    click.echo(f"{added} price(s) added, {len(rows) - added} already present")


@main.group()
def db() -> None:
    """Database schema."""


@db.command("upgrade")
@click.argument("revision", default="head")
def db_upgrade(revision: str) -> None:
    """Apply migrations up to REVISION (default: head)."""
    from metering.migrate import upgrade

    upgrade(load_settings().database_url, revision)
    click.echo(f"database at {revision}")


@main.command()
@click.option("--host", default="127.0.0.1")
@click.option("--port", default=8000, type=int)
@click.option("--workers", default=1, type=int)
def serve(host: str, port: int, workers: int) -> None:
    """Run the API with uvicorn (never with a default, placeholder or short key pepper)."""
    from api.server import run_api

    settings = load_settings()
    try:
        require_strong_pepper(settings)
    except WeakPepperError as exc:
        click.echo(f"fairmeter serve: {exc}", err=True)
        sys.exit(2)
    run_api(settings, host=host, port=port, workers=workers)


@main.command()
@click.option("--due", is_flag=True, required=True, help="Settle every run that is due now.")
def settle(due: bool) -> None:
    """Run a settlement sweep in this process (what the beat-driven workers do)."""
    from metering.settlement.runner import settle_due_now

    settings = load_settings()
    report = settle_due_now(create_db_engine(settings), settings)
    click.echo(
        f"{len(report.decided)} run(s) decided, {len(report.unchanged)} unchanged, "
        f"{len(report.not_due)} no longer due"
    )


from api.cli_statement import statement  # noqa: E402 - registered after the commands here
from api.cli_stripe import stripe  # noqa: E402
from api.cli_support import support  # noqa: E402
from api.launcher import up  # noqa: E402
from api.simulator.cli import simulate  # noqa: E402

main.add_command(up)
main.add_command(stripe)
main.add_command(statement)
main.add_command(support)
main.add_command(simulate)

from api.stripe_emulator.cli import stripe_emulator  # noqa: E402 - registered like `up`

main.add_command(stripe_emulator)


def run() -> None:
    try:
        main(standalone_mode=True)
    except MeteringError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    run()
