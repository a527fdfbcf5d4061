"""Billing use cases with their own transactions, for tasks, the CLI and the API."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from sqlalchemy.engine import Engine

from metering.billing import outbox, rate_store, rates, rejections, webhooks
from metering.billing.drift import (
    Difference,
    InvoiceDrift,
    compare,
    compared_until,
    describe_hour,
    hour_floor,
    ledger_hourly,
    our_books,
    stripe_customer_id,
    stripe_hourly,
    stripe_invoices,
)
from metering.billing.gateway import StripeFailure, StripeGateway
from metering.billing.rates import BillingRate
from metering.config import Settings
from metering.db import raw_transaction
from metering.errors import not_found

log = logging.getLogger("fairmeter.stripe")


def link_customer(
    engine: Engine, tenant: str, customer: str, stripe_id: str, rate: BillingRate | None = None
) -> int:
    """Set the customer's Stripe id, and its billing rate when known (``latest_invoice_rate``
    or the operator's); rows that waited for the id become due. Returns their count."""
    with raw_transaction(engine) as conn:
        result = conn.execute(
            "UPDATE customers SET stripe_customer_id = %s WHERE tenant_id = %s AND id = %s",
            (stripe_id, tenant, customer),
        )
        if result.rowcount == 0:
            raise not_found(f"no customer {customer}", code="customer_not_found")
        if rate is not None:
            rate_store.store(conn, tenant, customer, rate)
        released: int = outbox.release_waiting(conn, tenant, customer)
        return released


def latest_invoice_rate(settings: Settings, stripe_id: str) -> BillingRate | None:
    """The rate of the customer's newest invoice that has a line on our meter ("List all
    invoices", newest first — https://docs.stripe.com/api/invoices/list); None when Stripe
    has no such invoice yet (its first invoice's webhooks will teach it)."""
    gateway = StripeGateway(settings)
    try:
        gateway.meter_id()
        for invoice in gateway.customer_invoices(stripe_id):
            rate = rates.rate_of_invoice(gateway.metered_line_of(invoice), invoice)
            if rate is not None:
                return rate
    except (StripeFailure, LookupError) as exc:
        log.warning("billing rate not read from Stripe", extra={"why": str(exc)})
    return None


def handle_webhooks(engine: Engine, settings: Settings) -> int:
    """Handle the inbox: one transaction per event, Stripe fetches outside transactions."""
    with raw_transaction(engine) as conn:
        waiting = webhooks.pending(conn)
    handled = 0
    for event_id, type_, payload in waiting:
        unsampled: list[str] = []
        if webhooks.needs_fetch(type_, payload):
            payload = StripeGateway(settings).fetch_event(event_id)
        elif webhooks.foreign_version(type_, payload, settings.stripe_api_version):
            invoice_id = str(payload["data"]["object"]["id"])
            log.warning(
                "stripe snapshot event in another API version; invoice read in ours",
                extra={"event_id": event_id, "api_version": payload.get("api_version")},
            )
            invoice = StripeGateway(settings).retrieve_invoice(invoice_id)
            payload = webhooks.with_object(payload, invoice)
        if type_ in webhooks.THIN_TYPES:
            found = unsampled_rejections(engine, settings, payload)
            if found is None:
                continue  # left unhandled: a later pass reads settled summaries
            unsampled = found
        rate = invoice_rate(settings, payload) if webhooks.learns_rate(type_, payload) else None
        with raw_transaction(engine) as conn:
            handled += webhooks.handle_one(
                conn,
                event_id,
                payload,
                unit_micros=settings.stripe_meter_unit_micros,
                unsampled=unsampled,
                rate=rate,
            )
    return handled


def invoice_rate(settings: Settings, payload: dict[str, Any]) -> BillingRate | None:
    """The billing rate the event's invoice shows (its currency, our meter's line's price).
    Finding our line may ask Stripe for prices; when that fails, or there is no meter or
    line yet, nothing is learned now and the customer's next invoice teaches it."""
    invoice = payload["data"]["object"]
    try:
        line = StripeGateway(settings).metered_line_of(invoice)
        return rates.rate_of_invoice(line, invoice)
    except (StripeFailure, LookupError, ValueError) as exc:
        log.warning(
            "billing rate not learned from invoice",
            extra={"invoice": invoice.get("id"), "why": str(exc)},
        )
        return None


def unsampled_rejections(
    engine: Engine, settings: Settings, report: dict[str, Any]
) -> list[str] | None:
    """Meter events of the report's window that it did not sample but Stripe rejected; None
    while a summary of those hours may still lag (the report waits for a later pass).

    Reports count every error but sample only a few. For each customer and hour with
    events Stripe received in the window, what we sent minus Stripe's summary (minus the
    sampled rejections) is what else was rejected; when that equals the window's other
    events in the hour, they were all rejected (a customer's or meter's errors reject
    every event). Anything else is left to the drift check, and logged. A summary that
    has not caught up would make accepted events look rejected, so an hour is read only
    ``stripe_summary_trust_s`` after its last call (docs/stripe.md "Exactly once").
    """
    counts, sampled = rejections.error_counts(report), rejections.sampled_errors(report)
    window = rejections.validation_window(report)
    if window is None or sum(counts.values()) <= len(sampled):
        return []
    slack = timedelta(seconds=1)
    settled_before = datetime.now(UTC) - timedelta(seconds=settings.stripe_summary_trust_s)
    with raw_transaction(engine) as conn:
        groups = window_deliveries(conn, window[0] - slack, window[1] + slack)
        ours = {
            key: ledger_hourly(conn, key[0], key[1], min(g), max(g) + timedelta(hours=1))
            for key, g in groups.items()
        }
        calls = [last_call(conn, key[0], key[1], g) for key, g in groups.items()]
    last = max((call for call in calls if call is not None), default=None)
    if last is not None and last > settled_before:
        log.info("stripe error report waits for summaries", extra={"last_call": str(last)})
        return None
    return _attribute(StripeGateway(settings), groups, ours, {i for i, _ in sampled})


def _attribute(
    gateway: StripeGateway,
    groups: dict[tuple[str, str, str], dict[datetime, list[tuple[str, int]]]],
    ours: dict[tuple[str, str, str], dict[datetime, int]],
    sampled_ids: set[str],
) -> list[str]:
    """The unsampled events the settled summaries show rejected, hour by hour."""
    found: list[str] = []
    for (tenant, customer, stripe_id), by_hour in groups.items():
        start, end = min(by_hour), max(by_hour) + timedelta(hours=1)
        theirs = stripe_hourly(gateway, stripe_id, start, end)
        for hour, events in by_hour.items():
            missing = ours[(tenant, customer, stripe_id)].get(hour, 0) - theirs.get(hour, 0)
            missing -= sum(units for ident, units in events if ident in sampled_ids)
            others = [(ident, units) for ident, units in events if ident not in sampled_ids]
            if others and missing == sum(units for _, units in others):
                found += [ident for ident, _ in others]
            elif missing:
                log.error(
                    "stripe rejections not attributable",
                    extra={"customer": customer, "hour": hour.isoformat(), "units": missing},
                )
    return found


def last_call(
    conn: psycopg.Connection[Any], tenant: str, customer: str, hours: Iterable[datetime]
) -> datetime | None:
    """When Stripe last received a call that moves one of the customer's ``hours``: a meter
    event dated in it, or a cancel of one."""
    row = conn.execute(
        """
        SELECT max(d.stripe_received_at) FROM stripe_deliveries d
        JOIN stripe_deliveries e ON e.tenant_id = d.tenant_id AND e.kind = 'meter_event'
          AND e.identifier = COALESCE(d.cancels_identifier, d.identifier)
        WHERE d.tenant_id = %s AND d.customer_id = %s
          AND d.kind IN ('meter_event', 'meter_cancel')
          AND date_trunc('hour', e.event_timestamp) = ANY(%s)
        """,
        (tenant, customer, list(hours)),
    ).fetchone()
    return row[0] if row else None


def window_deliveries(
    conn: psycopg.Connection[Any], start: datetime, end: datetime
) -> dict[tuple[str, str, str], dict[datetime, list[tuple[str, int]]]]:
    """Live meter events Stripe received in ``[start, end]``, by customer and hour."""
    rows = conn.execute(
        """
        SELECT d.tenant_id, d.customer_id, c.stripe_customer_id, d.identifier, d.units,
               date_trunc('hour', d.event_timestamp)
        FROM stripe_deliveries d
        JOIN customers c ON c.tenant_id = d.tenant_id AND c.id = d.customer_id
        WHERE d.kind = 'meter_event' AND d.stripe_received_at BETWEEN %s AND %s
          AND d.event_timestamp IS NOT NULL AND c.stripe_customer_id IS NOT NULL
          AND (d.note IS NULL OR d.note NOT LIKE 'less than one%%')
          AND NOT EXISTS (SELECT 1 FROM stripe_deliveries x
                          WHERE x.kind IN ('meter_cancel', 'meter_rejected')
                            AND x.cancels_identifier = d.identifier)
        """,
        (start, end),
    ).fetchall()
    groups: dict[tuple[str, str, str], dict[datetime, list[tuple[str, int]]]] = {}
    for tenant, customer, stripe_id, identifier, units, hour in rows:
        by_hour = groups.setdefault((tenant, customer, stripe_id), {})
        by_hour.setdefault(hour, []).append((identifier, int(units)))
    return groups


def drift(
    engine: Engine,
    settings: Settings,
    tenant: str,
    customer: str,
    start: datetime,
    end: datetime,
    now: datetime | None = None,
) -> list[Difference]:
    """Every closed hour in [start, end) where our sent units and Stripe's summaries differ.
    The open hour, and the hours inside the summary lag, are never compared
    (``drift.compared_until``)."""
    until = compared_until(now or datetime.now(UTC), settings)
    start = hour_floor(start)
    end = min(hour_floor(end - timedelta(microseconds=1)) + timedelta(hours=1), until)
    with raw_transaction(engine) as conn:
        stripe_id = stripe_customer_id(conn, tenant, customer)
        ours = ledger_hourly(conn, tenant, customer, start, end) if start < end else {}
    if stripe_id is None:
        raise not_found(f"customer {customer} has no Stripe id", code="customer_not_linked")
    if start >= end:
        return []
    theirs = stripe_hourly(StripeGateway(settings), stripe_id, start, end)
    return compare(ours, theirs)


def invoice_drift(
    engine: Engine, settings: Settings, tenant: str, customer: str, start: datetime, end: datetime
) -> list[InvoiceDrift]:
    """The customer's finalized invoices whose period overlaps [start, end), each compared
    with our books (``drift.InvoiceDrift``); draft and not yet invoiced periods are skipped.
    Stripe is read outside the transaction, our books in one."""
    with raw_transaction(engine) as conn:
        stripe_id = stripe_customer_id(conn, tenant, customer)
    if stripe_id is None:
        raise not_found(f"customer {customer} has no Stripe id", code="customer_not_linked")
    invoices = stripe_invoices(StripeGateway(settings), stripe_id, start, end)
    unit = settings.stripe_meter_unit_micros
    with raw_transaction(engine) as conn:
        return [
            InvoiceDrift(tenant, customer, inv, our_books(conn, tenant, customer, inv, unit), unit)
            for inv in invoices
        ]


def linked_customers(engine: Engine, tenant: str) -> list[str]:
    """The tenant's customers with a Stripe id, whose invoices can be compared."""
    with raw_transaction(engine) as conn:
        rows = conn.execute(
            "SELECT id FROM customers WHERE tenant_id = %s AND stripe_customer_id IS NOT NULL "
            "ORDER BY id",
            (tenant,),
        ).fetchall()
    return [str(r[0]) for r in rows]


def recent_drift(engine: Engine, settings: Settings, now: datetime) -> list[str]:
    """The periodic check, as the lines ``fairmeter stripe drift`` prints for differences:
    the last day's closed hours of every customer who sent in it, and the finalized invoices
    of periods that ended within that day and the finalization grace (the ones Stripe
    finalized since), for every customer who sent in the month before."""
    start = now - timedelta(days=1)
    invoiced_since = start - timedelta(seconds=settings.stripe_finalization_grace_s)
    found = [
        describe_hour(tenant, customer, d)
        for tenant, customer in customers_sent_since(engine, start)
        for d in drift(engine, settings, tenant, customer, start, now, now=now)
    ]
    for tenant, customer in customers_sent_since(engine, invoiced_since - timedelta(days=31)):
        invoices = invoice_drift(engine, settings, tenant, customer, invoiced_since, now)
        found += [i.describe() for i in invoices if i.drifted]
    return found


def customers_sent_since(engine: Engine, since: datetime) -> list[tuple[str, str]]:
    with raw_transaction(engine) as conn:
        rows = conn.execute(
            "SELECT DISTINCT tenant_id, customer_id FROM stripe_deliveries "
            "WHERE kind = 'meter_event' AND event_timestamp >= %s",
            (since,),
        ).fetchall()
    return [(r[0], r[1]) for r in rows]
