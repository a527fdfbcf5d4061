"""Stripe webhooks: verify, store in the inbox (repeats are no-ops), handle later in a task."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

import psycopg
import stripe
from psycopg.types.json import Jsonb

from metering.errors import bad_request

log = logging.getLogger("fairmeter.stripe")


def verify(payload: bytes, signature: str | None, secret: str, tolerance_s: int) -> dict[str, Any]:
    """The event, if the signature is Stripe's for this payload and fresh; else a 400."""
    if not signature:
        raise bad_request("the Stripe-Signature header is missing", code="signature_missing")
    text = payload.decode("utf-8", errors="replace")
    try:
        # The SDK's own check (the one Webhook.construct_event runs); it also accepts thin
        # event notifications, which construct_event refuses by design.
        stripe.WebhookSignature.verify_header(text, signature, secret, tolerance_s)
    except stripe.SignatureVerificationError:
        raise bad_request("the webhook signature is not valid", code="signature_invalid") from None
    try:
        event: dict[str, Any] = json.loads(text)
    except ValueError:
        raise bad_request("the webhook body is not JSON", code="malformed_json") from None
    if not isinstance(event, dict):
        raise bad_request("the webhook body is not an event", code="invalid_event")
    if not isinstance(event.get("id"), str) or not isinstance(event.get("type"), str):
        raise bad_request("the event has no id or type", code="invalid_event")
    return event


def store(conn: psycopg.Connection[Any], event: dict[str, Any]) -> bool:
    """Record the event; False when it was already in the inbox."""
    result = conn.execute(
        "INSERT INTO stripe_webhook_inbox (event_id, type, payload) VALUES (%s, %s, %s) "
        "ON CONFLICT DO NOTHING",
        (event["id"], event["type"], Jsonb(event)),
    )
    return result.rowcount == 1


METER_ERROR_REPORT = "v1.billing.meter.error_report_triggered"


def pending(conn: psycopg.Connection[Any], limit: int = 100) -> list[tuple[str, str, Any]]:
    """Unhandled inbox events, oldest first: (event id, type, payload)."""
    rows = conn.execute(
        "SELECT event_id, type, payload FROM stripe_webhook_inbox WHERE handled_at IS NULL "
        "ORDER BY received_at LIMIT %s",
        (limit,),
    ).fetchall()
    return [(r[0], r[1], r[2]) for r in rows]


def needs_fetch(type_: str, payload: dict[str, Any]) -> bool:
    """Thin events (the meter error report) carry no data: it is fetched from Stripe."""
    return type_ == METER_ERROR_REPORT and not payload.get("data")


def handle_one(conn: psycopg.Connection[Any], event_id: str, payload: dict[str, Any]) -> bool:
    """Handle one inbox event exactly once (a concurrent handler skips it); False if taken."""
    row = conn.execute(
        "SELECT type FROM stripe_webhook_inbox WHERE event_id = %s AND handled_at IS NULL "
        "FOR UPDATE SKIP LOCKED",
        (event_id,),
    ).fetchone()
    if row is None:
        return False
    error = None
    if row[0] == "invoice.finalized":
        _close_period(conn, payload["data"]["object"])
    elif row[0] == METER_ERROR_REPORT:
        _mark_meter_errors(conn, payload)
    else:
        error = "ignored: no handler for this type"
    conn.execute(
        "UPDATE stripe_webhook_inbox SET handled_at = %s, error = %s WHERE event_id = %s",
        (datetime.now(UTC), error, event_id),
    )
    return True


def _close_period(conn: psycopg.Connection[Any], invoice: dict[str, Any]) -> None:
    """A finalized invoice closes its period: no negative meter corrections into it."""
    conn.execute(
        "INSERT INTO stripe_closed_periods (invoice_id, stripe_customer_id, period_start, "
        "period_end) VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING",
        (
            invoice["id"],
            invoice["customer"],
            datetime.fromtimestamp(int(invoice["period_start"]), UTC),
            datetime.fromtimestamp(int(invoice["period_end"]), UTC),
        ),
    )


def meter_error_identifiers(event: dict[str, Any]) -> list[str]:
    """Identifiers named by a meter error report's sample errors."""
    reason = (event.get("data") or {}).get("reason") or {}
    found = []
    for error_type in reason.get("error_types") or []:
        for sample in error_type.get("sample_errors") or []:
            identifier = (sample.get("request") or {}).get("identifier")
            if isinstance(identifier, str):
                found.append(meter_identifier(identifier))
    return found


def meter_identifier(reported: str) -> str:
    """Stripe reports the request's idempotency key there; ours embed the meter identifier
    (``fairmeter:<row>:<step>:<identifier>``), so both forms lead to the delivery."""
    if reported.startswith("fairmeter:"):
        parts = reported.split(":", 3)
        if len(parts) == 4:
            return parts[3]
    return reported


def _mark_meter_errors(conn: psycopg.Connection[Any], event: dict[str, Any]) -> None:
    """Stripe rejected these events after accepting them: their rows go to dead letter."""
    identifiers = meter_error_identifiers(event)
    result = conn.execute(
        """
        UPDATE stripe_outbox o SET status = 'dead',
               last_error = 'Stripe meter error report ' || %(event)s
        FROM stripe_deliveries d
        WHERE d.outbox_id = o.id AND d.kind = 'meter_event' AND d.identifier = ANY(%(ids)s)
        """,
        {"event": event["id"], "ids": identifiers},
    )
    log.error(
        "stripe meter error report",
        extra={"event_id": event["id"], "identifiers": identifiers, "rows": result.rowcount},
    )
