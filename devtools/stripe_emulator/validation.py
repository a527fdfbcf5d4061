"""Asynchronous validation of meter events and the error reports that follow.

With ``validation_mode = "async"`` the emulator does what Stripe's v1 meter-event endpoint
does: it answers 200 and validates later. A failed event never reaches summaries or invoices;
it is reported, grouped per meter and validation window, as a thin v2 event
``v1.billing.meter.error_report_triggered`` (or ``v1.billing.meter.no_meter_found`` when no
meter has the event name) whose full event counts every error per code and carries a capped
list of samples. Codes are the SDK's (``stripe/events/_v1_billing_meter_*``).
"""

from __future__ import annotations

from typing import Any

from devtools.stripe_emulator import destinations, webhooks
from devtools.stripe_emulator.periods import iso
from devtools.stripe_emulator.state import EmulatorState, Meter, MeterEvent, new_id

NO_METER_FOUND = "v1.billing.meter.no_meter_found"
CUSTOMER_NOT_FOUND = "meter_event_customer_not_found"


def classify(
    state: EmulatorState, event_name: str, payload: dict[str, str], timestamp: int, now: int
) -> tuple[Meter | None, str, int, tuple[str, str] | None]:
    """(meter, customer, value, (code, message) or None), checked as Stripe does later."""
    meter = state.meters_by_event.get(event_name)
    customer_key = meter.customer_key if meter else "stripe_customer_id"
    customer = payload.get(customer_key) or ""
    value_key = meter.value_key if meter else "value"
    value = _whole_number(payload.get(value_key))
    settings = state.settings
    checks = [
        (meter is None, "no_meter", f"No active meter found for event_name '{event_name}'."),
        (
            meter is not None and meter.status != "active",
            "archived_meter",
            f"The meter for event_name '{event_name}' is archived.",
        ),
        (not customer, "meter_event_no_customer_defined", f"Missing payload[{customer_key}]."),
        (
            value is None or (value < 0 and not settings.allow_negative_values),
            "meter_event_invalid_value",
            f"Invalid payload[{value_key}]: must be a non-negative whole number.",
        ),
        (
            timestamp < now - settings.past_window_s,
            "timestamp_too_far_in_past",
            f"Timestamp must be within the past {settings.past_window_s // 86400} days.",
        ),
        (
            timestamp > now + settings.future_window_s,
            "timestamp_in_future",
            f"Timestamp must be no more than {settings.future_window_s // 60} minutes in the "
            "future.",
        ),
        (
            customer not in state.customers,
            CUSTOMER_NOT_FOUND,
            f"No customer found with ID '{customer}'.",
        ),
    ]
    error = next(((code, message) for failed, code, message in checks if failed), None)
    return meter, customer, value or 0, error


def _whole_number(raw: str | None) -> int | None:
    if raw is None:
        return None
    text = raw.strip()
    digits = text[1:] if text[:1] in "+-" else text
    return int(text) if digits.isdigit() else None


def issue_due_reports(state: EmulatorState, *, force: bool = False) -> list[str]:
    """Report every unreported failed event, one report per meter; returns the event ids.

    Without ``force`` nothing is issued until ``error_report_delay_s`` after the oldest
    unreported failure (Stripe reports in batches, some time after the requests).
    """
    with state.lock:
        pending = [e for e in state.meter_events if e.error_code and e.reported_in is None]
        if not pending:
            return []
        now = state.clock.now()
        oldest = min(event.received_at for event in pending)
        if not force and oldest + state.settings.error_report_delay_s > now:
            return []
        by_meter: dict[str, list[MeterEvent]] = {}
        for event in pending:
            by_meter.setdefault(event.meter, []).append(event)
        return [_report(state, meter_id, events, now) for meter_id, events in by_meter.items()]


def _report(state: EmulatorState, meter_id: str, events: list[MeterEvent], now: int) -> str:
    errors = [
        {
            "code": event.error_code or "",
            "identifier": event.idempotency_key or event.identifier,
            "message": event.error_message or event.error_code or "",
        }
        for event in events
    ]
    start = iso(min(event.received_at for event in events))
    notification: dict[str, Any] = {
        "id": new_id("evt"),
        "object": "v2.core.event",
        "type": NO_METER_FOUND if not meter_id else webhooks.ERROR_REPORT,
        "livemode": False,
        "created": iso(now),
        "context": None,
        "reason": None,
    }
    if meter_id:
        notification["related_object"] = {
            "id": meter_id,
            "type": "billing.meter",
            "url": f"/v1/billing/meters/{meter_id}",
        }
    cap = state.settings.error_report_sample_cap
    data = webhooks.report_data(errors, start, iso(now), cap)
    state.events[notification["id"]] = {**notification, "data": data, "changes": None}
    destinations.enqueue(state, "thin", notification)
    for event in events:
        event.reported_in = notification["id"]
    return str(notification["id"])
