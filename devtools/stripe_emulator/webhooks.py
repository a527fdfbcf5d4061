"""Signed webhook delivery: Stripe's ``Stripe-Signature`` header and the two event kinds used.

The signature is ``t=<unix>,v1=<hex HMAC-SHA256 of "<t>.<payload>" under the endpoint secret>``,
exactly what ``stripe.Webhook.construct_event`` verifies. ``t`` is wall-clock time, not the
emulator clock, because the SDK checks its tolerance against ``time.time()``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from typing import Any

from devtools.stripe_emulator.settings import API_VERSION
from devtools.stripe_emulator.state import EmulatorState, MeterEvent, new_id

DELIVERY_TIMEOUT_S = 10.0
ERROR_REPORT = "v1.billing.meter.error_report_triggered"


def signature_header(payload: str, secret: str, timestamp: int | None = None) -> str:
    """The ``Stripe-Signature`` value for ``payload`` signed at ``timestamp`` (default: now)."""
    signed_at = int(time.time()) if timestamp is None else timestamp
    digest = hmac.new(
        secret.encode(), f"{signed_at}.{payload}".encode(), hashlib.sha256
    ).hexdigest()
    return f"t={signed_at},v1={digest}"


def snapshot_event(
    state: EmulatorState, event_type: str, data_object: dict[str, Any]
) -> dict[str, Any]:
    """A v1 snapshot event carrying a copy of the object, as ``/v1/events`` holds them."""
    event: dict[str, Any] = {
        "id": new_id("evt"),
        "object": "event",
        "api_version": API_VERSION,
        "created": state.clock.now(),
        "data": {"object": data_object},
        "livemode": False,
        "pending_webhooks": 1,
        "request": {"id": None, "idempotency_key": None},
        "type": event_type,
    }
    with state.lock:
        state.events[event["id"]] = event
    return event


def invoice_finalized(state: EmulatorState, spec: dict[str, Any]) -> dict[str, Any]:
    """``invoice.finalized`` for ``spec["customer"]`` over ``period_start``..``period_end``."""
    now = state.clock.now()
    amount_due = int(spec.get("amount_due", 0))
    invoice: dict[str, Any] = {
        "id": new_id("in"),
        "object": "invoice",
        "amount_due": amount_due,
        "amount_paid": 0,
        "amount_remaining": amount_due,
        "created": now,
        "currency": "usd",
        "customer": spec["customer"],
        "lines": {"object": "list", "data": [], "has_more": False, "url": "/v1/invoices/lines"},
        "livemode": False,
        "period_end": int(spec.get("period_end", now)),
        "period_start": int(spec.get("period_start", now - 30 * 86400)),
        "status": "open",
        "status_transitions": {"finalized_at": now},
        "subtotal": amount_due,
        "total": amount_due,
    }
    invoice.update(spec.get("invoice", {}))
    with state.lock:
        state.invoices[invoice["id"]] = invoice
    return snapshot_event(state, "invoice.finalized", invoice)


def meter_error_report(
    state: EmulatorState, spec: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A thin ``v1.billing.meter.error_report_triggered`` event: (notification, full event).

    Errors come from ``spec["errors"]`` (``[{"code", "identifier", "message"}]``) or else from
    the meter's flagged events in state. The notification carries no ``data`` (as Stripe's thin
    payloads); ``GET /v2/core/events/<id>`` returns the full event. ``spec["inline_data"]``
    puts ``data`` in the notification too.
    """
    with state.lock:
        meter_id = spec.get("meter") or _first_errored_meter(state)
        errors = spec.get("errors") or _flagged_errors(state, meter_id)
    now = datetime.fromtimestamp(state.clock.now(), UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    notification: dict[str, Any] = {
        "id": new_id("evt"),
        "object": "v2.core.event",
        "type": ERROR_REPORT,
        "livemode": False,
        "created": now,
        "related_object": {
            "id": meter_id,
            "type": "billing.meter",
            "url": f"/v1/billing/meters/{meter_id}",
        },
    }
    full = {**notification, "data": report_data(errors, now, now), "changes": None, "context": None}
    with state.lock:
        state.events[notification["id"]] = full
    if spec.get("inline_data"):
        notification["data"] = full["data"]
    return notification, full


def deliver(
    state: EmulatorState,
    url: str,
    secret: str,
    event: dict[str, Any],
    *,
    times: int = 1,
    signed_at: int | None = None,
) -> list[dict[str, Any]]:
    """POST the event ``times`` times (same id each time), signed; returns each outcome."""
    payload = json.dumps(event, separators=(",", ":"))
    outcomes = []
    for attempt in range(1, times + 1):
        header = signature_header(payload, secret, signed_at)
        outcome = {"event": event["id"], "type": event["type"], "url": url, "attempt": attempt}
        outcome.update(post_signed(url, payload, header))
        outcomes.append(outcome)
        with state.lock:
            state.deliveries.append(outcome)
    return outcomes


def post_signed(url: str, payload: str, header: str) -> dict[str, Any]:
    """POST one signed payload; the receiver's status and body, or the connection error."""
    request = urllib.request.Request(  # noqa: S310 - the URL is the operator's own endpoint
        url,
        data=payload.encode(),
        method="POST",
        headers={
            "Content-Type": "application/json; charset=utf-8",
            "Stripe-Signature": header,
            "User-Agent": "Stripe/1.0 (+https://stripe.com/docs/webhooks)",
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=DELIVERY_TIMEOUT_S) as response:  # noqa: S310
            return {"status": response.status, "body": response.read(2000).decode(errors="replace")}
    except urllib.error.HTTPError as exc:
        return {"status": exc.code, "body": exc.read(2000).decode(errors="replace")}
    except (urllib.error.URLError, OSError) as exc:
        return {"status": None, "error": str(exc)}


def _first_errored_meter(state: EmulatorState) -> str | None:
    for event in state.meter_events:
        if event.error_code:
            return event.meter
    return next(iter(state.meters), None)


def _flagged_errors(state: EmulatorState, meter_id: str | None) -> list[dict[str, str]]:
    flagged: list[MeterEvent] = [
        e for e in state.meter_events if e.meter == meter_id and e.error_code
    ]
    return [
        {
            "code": event.error_code or "",
            "identifier": event.idempotency_key or event.identifier,
            "message": f"No customer found with ID '{event.customer}'.",
        }
        for event in flagged
    ]


def report_data(
    errors: list[dict[str, str]], start: str, end: str, sample_cap: int = 5
) -> dict[str, Any]:
    """The ``data`` of a meter error report: every error counted, at most ``sample_cap``
    samples per code (each naming the request's idempotency key or identifier)."""
    by_code: dict[str, list[dict[str, str]]] = {}
    for error in errors:
        by_code.setdefault(error["code"], []).append(error)
    error_types = [
        {
            "code": code,
            "error_count": len(items),
            "sample_errors": [
                {
                    "error_message": item.get("message", code),
                    "request": {"identifier": item["identifier"]},
                }
                for item in items[:sample_cap]
            ],
        }
        for code, items in by_code.items()
    ]
    return {
        "developer_message_summary": f"{len(errors)} meter event(s) failed validation.",
        "reason": {"error_count": len(errors), "error_types": error_types},
        "validation_end": end,
        "validation_start": start,
    }
