"""Meter events and their cancellation (``/v1/billing/meter_event{s,_adjustments}``).

In sync mode (the default) checked at once: the event name names an active meter, the value is
a whole number (negative only when allowed), the timestamp is at most 35 days old and 5
minutes ahead; an unknown customer is accepted and flagged. In async mode (``validation_mode``)
all of those are accepted with 200 and flagged for a later error report (``validation``).
In both, the identifier is ≤ 100 characters and unused within the identifier window.
"""

from __future__ import annotations

import uuid
from typing import Any

from devtools.stripe_emulator import invoicing, validation
from devtools.stripe_emulator.errors import invalid_request, missing_param
from devtools.stripe_emulator.forms import Params
from devtools.stripe_emulator.params import (
    check_known,
    optional_int,
    optional_str,
    parse_int,
    required_str,
    string_map,
)
from devtools.stripe_emulator.state import EmulatorState, LockKey, Meter, MeterEvent
from devtools.stripe_emulator.validation import CUSTOMER_NOT_FOUND

MAX_IDENTIFIER = 100


def lock_key(state: EmulatorState, params: Params) -> LockKey | None:
    """The (customer, meter) slot a meter-event request occupies while in flight."""
    payload = params.get("payload")
    event_name = params.get("event_name")
    if not isinstance(payload, dict) or not isinstance(event_name, str):
        return None
    with state.lock:
        meter = state.meters_by_event.get(event_name)
    customer = payload.get(meter.customer_key if meter else "stripe_customer_id")
    return (customer, event_name) if isinstance(customer, str) else None


def create_meter_event(
    state: EmulatorState, params: Params, idempotency_key: str | None = None
) -> dict[str, Any]:
    check_known(params, {"event_name", "payload", "identifier", "timestamp"})
    event_name = required_str(params, "event_name")
    payload = string_map(params, "payload")
    identifier = optional_str(params, "identifier") or str(uuid.uuid4())
    if len(identifier) > MAX_IDENTIFIER:
        raise invalid_request(
            f"Invalid identifier: must be at most {MAX_IDENTIFIER} characters",
            param="identifier",
        )
    timestamp = optional_int(params, "timestamp")
    with state.lock:
        now = state.clock.now()
        timestamp = now if timestamp is None else timestamp
        meter, customer, value, error = _validate(state, event_name, payload, timestamp, now)
        _check_identifier(state, identifier, now)
        event = MeterEvent(
            identifier=identifier,
            event_name=event_name,
            meter=meter.id if meter else "",
            customer=customer,
            value=value,
            timestamp=timestamp,
            received_at=now,
            payload=payload,
            idempotency_key=idempotency_key,
            error_code=error[0] if error else None,
            error_message=error[1] if error else None,
        )
        state.add_meter_event(event)
        if event.counts:
            invoicing.note_usage(state, customer, timestamp)
    return render_meter_event(event)


def render_meter_event(event: MeterEvent) -> dict[str, Any]:
    return {
        "object": "billing.meter_event",
        "created": event.received_at,
        "event_name": event.event_name,
        "identifier": event.identifier,
        "livemode": False,
        "payload": dict(event.payload),
        "timestamp": event.timestamp,
    }


def cancel_meter_event(state: EmulatorState, params: Params) -> dict[str, Any]:
    """Cancel an event received less than ``cancel_window_s`` ago; it leaves the summaries."""
    check_known(params, {"event_name", "type", "cancel"})
    event_name = required_str(params, "event_name")
    kind = required_str(params, "type")
    if kind != "cancel":
        raise invalid_request("Invalid type: must be one of cancel", param="type")
    cancel = params.get("cancel")
    if not isinstance(cancel, dict):
        raise missing_param("cancel")
    identifier = required_str(cancel, "identifier", label="cancel[identifier]")
    with state.lock:
        _meter_named(state, event_name)
        event = state.events_by_identifier.get(identifier)
        if event is None or event.event_name != event_name:
            raise invalid_request(
                f"No meter event with identifier '{identifier}' exists for event_name "
                f"'{event_name}'.",
                param="cancel[identifier]",
                code="resource_missing",
            )
        now = state.clock.now()
        _check_cancellable(state, event, now)
        event.cancelled_at = now
    return {
        "object": "billing.meter_event_adjustment",
        "cancel": {"identifier": identifier},
        "event_name": event_name,
        "livemode": False,
        "status": "pending",
        "type": "cancel",
    }


def _validate(
    state: EmulatorState, event_name: str, payload: dict[str, str], timestamp: int, now: int
) -> tuple[Meter | None, str, int, tuple[str, str] | None]:
    """Sync mode refuses a bad event with 400; async mode accepts it and flags it."""
    if state.settings.validation_mode == "async":
        return validation.classify(state, event_name, payload, timestamp, now)
    meter = _meter_named(state, event_name)
    customer, value = _customer_and_value(state, meter, payload)
    _check_timestamp(state, timestamp, now)
    if customer in state.customers:
        return meter, customer, value, None
    return meter, customer, value, (CUSTOMER_NOT_FOUND, f"No customer found with ID '{customer}'.")


def _meter_named(state: EmulatorState, event_name: str) -> Meter:
    meter = state.meters_by_event.get(event_name)
    if meter is None or meter.status != "active":
        raise invalid_request(
            f"No active meter found for event_name '{event_name}'.", param="event_name"
        )
    return meter


def _customer_and_value(
    state: EmulatorState, meter: Meter, payload: dict[str, str]
) -> tuple[str, int]:
    customer = payload.get(meter.customer_key)
    if not customer:
        raise missing_param(f"payload[{meter.customer_key}]")
    value_param = f"payload[{meter.value_key}]"
    raw_value = payload.get(meter.value_key)
    if raw_value is None or raw_value == "":
        raise missing_param(value_param)
    value = parse_int(raw_value, value_param)
    if value < 0 and not state.settings.allow_negative_values:
        raise invalid_request(
            f"Invalid {value_param}: must be a non-negative whole number.", param=value_param
        )
    return customer, value


def _check_timestamp(state: EmulatorState, timestamp: int, now: int) -> None:
    settings = state.settings
    if timestamp < now - settings.past_window_s:
        days = settings.past_window_s // 86400
        raise invalid_request(f"Timestamp must be within the past {days} days.", param="timestamp")
    if timestamp > now + settings.future_window_s:
        minutes = settings.future_window_s // 60
        raise invalid_request(
            f"Timestamp must be no more than {minutes} minutes in the future.",
            param="timestamp",
        )


def _check_identifier(state: EmulatorState, identifier: str, now: int) -> None:
    previous = state.events_by_identifier.get(identifier)
    if previous is None:
        return
    window = state.settings.identifier_window_s
    if window is None or now - previous.received_at < window:
        # Stripe's words; it sets no error code on this one.
        raise invalid_request(f"An event already exists with identifier {identifier}.")


def _check_cancellable(state: EmulatorState, event: MeterEvent, now: int) -> None:
    if event.cancelled:
        raise invalid_request(
            f"The meter event with identifier '{event.identifier}' has already been canceled.",
            param="cancel[identifier]",
        )
    if now - event.received_at >= state.settings.cancel_window_s:
        hours = state.settings.cancel_window_s // 3600
        raise invalid_request(
            f"Meter event with identifier '{event.identifier}' can no longer be canceled: "
            f"cancellations are accepted within {hours} hours of Stripe receiving the event.",
            param="cancel[identifier]",
        )
