"""``fairmeter keys …``: create and revoke API keys."""

from __future__ import annotations

from datetime import datetime

import click

from metering.config import load_cli_settings
from metering.db import create_db_engine, raw_transaction
from metering.keys import Scope


@click.group()
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

    settings = load_cli_settings()
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

    engine = create_db_engine(load_cli_settings())
    with raw_transaction(engine) as conn:
        revoke_key(conn, key_id)
    click.echo(f"revoked {key_id}")
