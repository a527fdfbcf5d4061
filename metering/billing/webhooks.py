"""Stripe webhooks: verify, store in the inbox (repeats are no-ops), handle later in a task.

Two streams, each from its own event destination with its own signing secret ("Event
destinations"): snapshot events (v1: ``invoice.*``, ``credit_note.*``) carry the object;
thin events (v2: ``v1.billing.meter.error_report_triggered``, ``…no_meter_found``) carry
only an id and are fetched in full before they are handled ("Types of events v2": "you must
fetch the versioned event from the API").
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import psycopg
import stripe
from psycopg.types.json import Jsonb

from metering.billing import rate_store, rejections
from metering.billing.rates import BillingRate
from metering.errors import bad_request

log = logging.getLogger("fairmeter.stripe")


def verify(
    payload: bytes, signature: str | None, secret: str, tolerance_s: int, *, thin: bool = False
) -> dict[str, Any]:
    """The event, if the signature is Stripe's for this payload and fresh, and the event is
    of the destination's style (snapshot or thin); else a 400."""
    if not signature:
        raise bad_request("the Stripe-Signature header is missing", code="signature_missing")
    text = payload.decode("utf-8", errors="replace")
    try:
        if thin:
            # The SDK parses thin notifications (and verifies them the same way).
            notification = _PARSER.parse_event_notification(text, signature, secret, tolerance_s)
            return {"id": notification.id, "object": "v2.core.event", "type": notification.type}
        stripe.WebhookSignature.verify_header(text, signature, secret, tolerance_s)
    except stripe.SignatureVerificationError:
        raise bad_request("the webhook signature is not valid", code="signature_invalid") from None
    except (ValueError, KeyError, TypeError, AttributeError):
        raise bad_request("the body is not a thin event", code="invalid_event") from None
    try:
        event: dict[str, Any] = json.loads(text)
    except ValueError:
        raise bad_request("the webhook body is not JSON", code="malformed_json") from None
    if not isinstance(event, dict):
        raise bad_request("the webhook body is not an event", code="invalid_event")
    if not isinstance(event.get("id"), str) or not isinstance(event.get("type"), str):
        raise bad_request("the event has no id or type", code="invalid_event")
    if event.get("object") == "v2.core.event":
        raise bad_request(
            "a thin event was sent to the snapshot endpoint; use /webhooks/stripe/thin",
            code="wrong_destination",
        )
    return event


# Parses thin notifications offline (no request is made with this key).
_PARSER = stripe.StripeClient("sk_parse_only")


def store(conn: psycopg.Connection[Any], event: dict[str, Any]) -> bool:
    """Record the event; False when it was already in the inbox."""
    result = conn.execute(
        "INSERT INTO stripe_webhook_inbox (event_id, type, payload) VALUES (%s, %s, %s) "
        "ON CONFLICT DO NOTHING",
        (event["id"], event["type"], Jsonb(event)),
    )
    return result.rowcount == 1


METER_ERROR_REPORT = "v1.billing.meter.error_report_triggered"
NO_METER_FOUND = "v1.billing.meter.no_meter_found"
THIN_TYPES = frozenset({METER_ERROR_REPORT, NO_METER_FOUND})
INVOICE_TYPES = frozenset(
    {"invoice.created", "invoice.finalized", "invoice.paid", "invoice.updated", "invoice.voided"}
)
# The invoice events a customer's billing rate is learned from (``learns_rate``).
RATE_TYPES = frozenset({"invoice.created", "invoice.finalized"})


def pending(conn: psycopg.Connection[Any], limit: int = 100) -> list[tuple[str, str, Any]]:
    """Unhandled inbox events, oldest first: (event id, type, payload)."""
    rows = conn.execute(
        "SELECT event_id, type, payload FROM stripe_webhook_inbox WHERE handled_at IS NULL "
        "ORDER BY received_at LIMIT %s",
        (limit,),
    ).fetchall()
    return [(r[0], r[1], r[2]) for r in rows]


def foreign_version(type_: str, payload: dict[str, Any], pinned: str) -> bool:
    """Whether a snapshot invoice event was rendered in another API version than ours.

    Stripe renders a snapshot event's object in its endpoint's API version (the account's
    default unless the endpoint pins one: "Handle webhook versioning"), which can differ
    from ``stripe_api_version`` — an endpoint left on an old version, or both versions during
    an upgrade. Rather than parse a shape we did not pin, the handler logs it and reads the
    invoice from the API under the pinned version (``service.handle_webhooks``)."""
    version = payload.get("api_version")
    return type_ in INVOICE_TYPES and isinstance(version, str) and version != pinned


def with_object(payload: dict[str, Any], obj: dict[str, Any]) -> dict[str, Any]:
    """The event with its ``data.object`` replaced (by the object as our version renders it)."""
    return {**payload, "data": {**(payload.get("data") or {}), "object": obj}}


def needs_fetch(type_: str, payload: dict[str, Any]) -> bool:
    """Thin events (the meter error reports) carry no data: it is fetched from Stripe."""
    return type_ in THIN_TYPES and not payload.get("data")


def handle_one(
    conn: psycopg.Connection[Any],
    event_id: str,
    payload: dict[str, Any],
    *,
    unit_micros: int = 1,
    unsampled: Sequence[str] = (),
    rate: BillingRate | None = None,
) -> bool:
    """Handle one inbox event exactly once (a concurrent handler skips it); False if taken.
    ``unsampled``: identifiers a meter error report did not sample but the comparison with
    Stripe's summaries showed rejected (service.handle_webhooks). ``rate``: the billing rate
    the invoice shows (``rates.rate_of_invoice``, read from Stripe before the transaction),
    stored on the invoice's customer."""
    row = conn.execute(
        "SELECT type FROM stripe_webhook_inbox WHERE event_id = %s AND handled_at IS NULL "
        "FOR UPDATE SKIP LOCKED",
        (event_id,),
    ).fetchone()
    if row is None:
        return False
    error = None
    if row[0] in INVOICE_TYPES:
        _track_invoice(conn, row[0], payload["data"]["object"])
        if rate is not None:
            rate_store.store_for_stripe_customer(
                conn, str(payload["data"]["object"]["customer"]), rate
            )
    elif row[0] in THIN_TYPES:
        waiting = rejections.in_flight(conn, payload, unsampled, datetime.now(UTC))
        if waiting is not None:
            # Left unhandled (and unlocked at commit): the next pass applies it.
            log.info("stripe error report deferred", extra={"event_id": event_id, "why": waiting})
            return False
        rejections.handle_report(conn, payload, unsampled, unit_micros)
    elif row[0].startswith("credit_note."):
        error = "recorded: credit notes are tracked as deliveries"
    else:
        error = "ignored: no handler for this type"
    conn.execute(
        "UPDATE stripe_webhook_inbox SET handled_at = %s, error = %s WHERE event_id = %s",
        (datetime.now(UTC), error, event_id),
    )
    return True


def learns_rate(type_: str, payload: dict[str, Any]) -> bool:
    """Whether the event's invoice teaches its customer's billing rate: an invoice created
    or finalized carries its currency and its lines ("The Invoice object" —
    https://docs.stripe.com/api/invoices/object)."""
    invoice = (payload.get("data") or {}).get("object") or {}
    return type_ in RATE_TYPES and bool(invoice.get("customer")) and bool(invoice.get("currency"))


def _track_invoice(conn: psycopg.Connection[Any], type_: str, invoice: dict[str, Any]) -> None:
    """Keep what the planner needs from an invoice: its period, currency, when it finalizes,
    and whether it is final. A period stays open until its invoice is finalized."""
    if invoice.get("period_start") is None or invoice.get("period_end") is None:
        return
    transitions = invoice.get("status_transitions") or {}
    status = str(invoice.get("status") or ("open" if type_ == "invoice.finalized" else "draft"))
    if type_ == "invoice.finalized" and status == "draft":
        status = "open"
    conn.execute(
        """
        INSERT INTO stripe_invoices (invoice_id, stripe_customer_id, currency, status,
            period_start, period_end, finalizes_at, finalized_at, paid_at)
        VALUES (%(id)s, %(customer)s, %(currency)s, %(status)s, %(start)s, %(end)s,
                %(finalizes)s, %(finalized)s, %(paid)s)
        ON CONFLICT (invoice_id) DO UPDATE SET
            status = CASE WHEN stripe_invoices.status = 'draft' OR EXCLUDED.status <> 'draft'
                          THEN EXCLUDED.status ELSE stripe_invoices.status END,
            finalizes_at = COALESCE(EXCLUDED.finalizes_at, stripe_invoices.finalizes_at),
            finalized_at = COALESCE(EXCLUDED.finalized_at, stripe_invoices.finalized_at),
            paid_at = COALESCE(EXCLUDED.paid_at, stripe_invoices.paid_at),
            updated_at = now()
        """,
        {
            "id": invoice["id"],
            "customer": invoice["customer"],
            "currency": str(invoice.get("currency") or "usd"),
            "status": status,
            "start": _utc(invoice["period_start"]),
            "end": _utc(invoice["period_end"]),
            "finalizes": _utc(invoice.get("automatically_finalizes_at")),
            "finalized": _utc(transitions.get("finalized_at")),
            "paid": _utc(transitions.get("paid_at")),
        },
    )
    if status != "draft":
        _close_period(conn, invoice)


def _utc(stamp: Any) -> datetime | None:
    return None if stamp is None else datetime.fromtimestamp(int(stamp), UTC)


def _close_period(conn: psycopg.Connection[Any], invoice: dict[str, Any]) -> None:
    """A finalized invoice closes its period: nothing is dated, cancelled or resent into it."""
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
