"""``fairmeter webhooks …``: a tenant's webhook endpoints, their delivery log, redelivery.

The operator acts as an admin of the ``--tenant`` given, through the same use cases as the
API (the same checks, the secret printed once).
"""

from __future__ import annotations

from datetime import UTC, datetime

import click

from metering.config import load_cli_settings
from metering.db import create_db_engine, raw_transaction
from metering.keys import Principal, Scope
from metering.notifications import EVENT_TYPES
from metering.webhooks import endpoints as uses
from metering.webhooks import log
from metering.webhooks.endpoints import EndpointView


def _operator(tenant: str) -> Principal:
    return Principal(tenant_id=tenant, scope=Scope.ADMIN, key_id="cli")


def _line(view: EndpointView) -> str:
    state = "enabled" if view.enabled else f"disabled ({view.disabled_reason})"
    types = ",".join(view.event_types) or "*"
    return f"{view.id}\t{state}\t{types}\t{view.url}\t{view.description}"


@click.group()
def webhooks() -> None:
    """Webhook endpoints, deliveries and redelivery (docs/webhooks.md)."""


@webhooks.group("endpoints")
def endpoints() -> None:
    """Create, list, rotate and disable endpoints."""


@endpoints.command("create")
@click.option("--tenant", required=True)
@click.option("--url", required=True, help="https:// URL of a public address.")
@click.option(
    "--type",
    "types",
    multiple=True,
    type=click.Choice(sorted(EVENT_TYPES)),
    help="An event type to send (repeat); none: every type.",
)
@click.option("--description", default="")
@click.option("--disabled", is_flag=True, help="Create it disabled.")
def create(tenant: str, url: str, types: tuple[str, ...], description: str, disabled: bool) -> None:
    """Add an endpoint and print its signing secret, once."""
    settings = load_cli_settings()
    spec = uses.EndpointSpec(url, types, description, not disabled)
    with raw_transaction(create_db_engine(settings)) as conn:
        view, secret = uses.create_endpoint(conn, _operator(tenant), spec, settings)
    click.echo(f"endpoint id: {view.id}", err=True)
    click.echo(secret)


@endpoints.command("list")
@click.option("--tenant", required=True)
def list_endpoints(tenant: str) -> None:
    """The tenant's endpoints: id, state, types, URL, description."""
    with raw_transaction(create_db_engine(load_cli_settings())) as conn:
        found = uses.list_endpoints(conn, _operator(tenant))
    for view in found:
        click.echo(_line(view))
    click.echo(f"{len(found)} endpoint(s)")


@endpoints.command("rotate")
@click.argument("endpoint")
@click.option("--tenant", required=True)
def rotate(endpoint: str, tenant: str) -> None:
    """Print a new secret, once; the old one signs beside it for the overlap (24 h)."""
    settings = load_cli_settings()
    with raw_transaction(create_db_engine(settings)) as conn:
        view, secret = uses.rotate_secret(
            conn, _operator(tenant), endpoint, settings, datetime.now(UTC)
        )
    assert view.previous_secret_expires_at is not None
    click.echo(f"old secret signs too until {view.previous_secret_expires_at:%F %T} UTC", err=True)
    click.echo(secret)


@endpoints.command("disable")
@click.argument("endpoint")
@click.option("--tenant", required=True)
@click.option("--enable", is_flag=True, help="Enable it instead (its pending messages resume).")
def disable(endpoint: str, tenant: str, enable: bool) -> None:
    """Stop (or with --enable, resume) deliveries to an endpoint."""
    settings = load_cli_settings()
    change = uses.EndpointChange(enabled=enable)
    with raw_transaction(create_db_engine(settings)) as conn:
        view = uses.update_endpoint(conn, _operator(tenant), endpoint, change, settings)
    click.echo(_line(view))


@webhooks.command("deliveries")
@click.argument("endpoint")
@click.option("--tenant", required=True)
@click.option("--status", type=click.Choice(["pending", "delivered", "failed"]), default=None)
@click.option("--limit", type=click.IntRange(1, 200), default=50)
def deliveries(endpoint: str, tenant: str, status: str | None, limit: int) -> None:
    """The endpoint's latest messages: id, type, run, status, attempts, last answer."""
    with raw_transaction(create_db_engine(load_cli_settings())) as conn:
        page = log.deliveries(conn, _operator(tenant), endpoint, status=status, limit=limit)
    for d in page.deliveries:
        last = d.attempts[-1] if d.attempts else None
        answer = "-" if last is None else str(last.status_code or last.error)
        next_at = f"\tnext {d.next_attempt_at:%F %T}" if d.next_attempt_at else ""
        click.echo(
            f"{d.message_id}\t{d.type}\t{d.run or '-'}\t{d.status}\t"
            f"{d.attempt_count} attempt(s)\t{answer}{next_at}"
        )
    click.echo(f"{len(page.deliveries)} message(s)" + (" (more)" if page.next_cursor else ""))


@webhooks.command("redeliver")
@click.option("--tenant", required=True)
@click.option("--message", default=None, help="One message id (msg_…).")
@click.option("--endpoint", default=None, help="With --since: the endpoint.")
@click.option("--since", type=click.DateTime(), default=None, help="UTC; with --endpoint.")
def redeliver(
    tenant: str, message: str | None, endpoint: str | None, since: datetime | None
) -> None:
    """Send again one message, or every message an endpoint was given since a time."""
    now = datetime.now(UTC)
    with raw_transaction(create_db_engine(load_cli_settings())) as conn:
        if message is not None and endpoint is None and since is None:
            view = log.redeliver_message(conn, _operator(tenant), message, now)
            click.echo(f"requeued {view.message_id}")
            return
        if message is None and endpoint is not None and since is not None:
            moment = since.replace(tzinfo=UTC)
            count = log.redeliver_since(conn, _operator(tenant), endpoint, moment, now)
            click.echo(f"requeued {count} message(s)")
            return
    raise click.UsageError("give --message, or --endpoint with --since")
