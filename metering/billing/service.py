"""Billing use cases with their own transactions, for tasks, the CLI and the API."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy.engine import Engine

from metering.billing import outbox, webhooks
from metering.billing.drift import (
    Difference,
    compare,
    hour_floor,
    ledger_hourly,
    stripe_customer_id,
    stripe_hourly,
)
from metering.billing.gateway import StripeGateway
from metering.config import Settings
from metering.db import raw_transaction
from metering.errors import not_found


def link_customer(engine: Engine, tenant: str, customer: str, stripe_id: str) -> int:
    """Set the customer's Stripe id; rows that waited for it become due. Returns their count."""
    with raw_transaction(engine) as conn:
        result = conn.execute(
            "UPDATE customers SET stripe_customer_id = %s WHERE tenant_id = %s AND id = %s",
            (stripe_id, tenant, customer),
        )
        if result.rowcount == 0:
            raise not_found(f"no customer {customer}", code="customer_not_found")
        released: int = outbox.release_waiting(conn, tenant, customer)
        return released


def handle_webhooks(engine: Engine, settings: Settings) -> int:
    """Handle the inbox: one transaction per event, Stripe fetches outside transactions."""
    with raw_transaction(engine) as conn:
        waiting = webhooks.pending(conn)
    handled = 0
    for event_id, type_, payload in waiting:
        if webhooks.needs_fetch(type_, payload):
            payload = StripeGateway(settings).fetch_event(event_id)
        with raw_transaction(engine) as conn:
            handled += webhooks.handle_one(conn, event_id, payload)
    return handled


def drift(
    engine: Engine, settings: Settings, tenant: str, customer: str, start: datetime, end: datetime
) -> list[Difference]:
    """Every hour in [start, end) where our sent units and Stripe's summaries differ."""
    start, end = hour_floor(start), hour_floor(end - timedelta(microseconds=1)) + timedelta(hours=1)
    with raw_transaction(engine) as conn:
        stripe_id = stripe_customer_id(conn, tenant, customer)
        ours = ledger_hourly(conn, tenant, customer, start, end)
    if stripe_id is None:
        raise not_found(f"customer {customer} has no Stripe id", code="customer_not_linked")
    theirs = stripe_hourly(StripeGateway(settings), stripe_id, start, end)
    return compare(ours, theirs)


def customers_sent_since(engine: Engine, since: datetime) -> list[tuple[str, str]]:
    with raw_transaction(engine) as conn:
        rows = conn.execute(
            "SELECT DISTINCT tenant_id, customer_id FROM stripe_deliveries "
            "WHERE kind = 'meter_event' AND event_timestamp >= %s",
            (since,),
        ).fetchall()
    return [(r[0], r[1]) for r in rows]
