"""Billing meters and their event summaries (``/v1/billing/meters...``)."""

from __future__ import annotations

import hashlib
from typing import Any

from devtools.stripe_emulator.errors import invalid_request, resource_missing
from devtools.stripe_emulator.forms import Params
from devtools.stripe_emulator.lists import paginate
from devtools.stripe_emulator.params import (
    check_known,
    hash_param,
    optional_str,
    required_int,
    required_str,
)
from devtools.stripe_emulator.state import EmulatorState, Meter, MeterEvent, new_id

FORMULAS = frozenset({"sum", "count", "last"})
WINDOWS_S = {"hour": 3600, "day": 86400}
MINUTE_S = 60


def create_meter(state: EmulatorState, params: Params) -> dict[str, Any]:
    check_known(
        params,
        {
            "display_name",
            "event_name",
            "default_aggregation",
            "customer_mapping",
            "value_settings",
            "event_time_window",
        },
    )
    display_name = required_str(params, "display_name")
    event_name = required_str(params, "event_name")
    formula = required_str(
        hash_param(params, "default_aggregation"),
        "formula",
        label="default_aggregation[formula]",
    )
    if formula not in FORMULAS:
        raise invalid_request(
            f"Invalid default_aggregation[formula]: must be one of {sorted(FORMULAS)}",
            param="default_aggregation[formula]",
        )
    mapping = hash_param(params, "customer_mapping")
    customer_key = optional_str(mapping, "event_payload_key") or "stripe_customer_id"
    value_key = optional_str(hash_param(params, "value_settings"), "event_payload_key")
    with state.lock:
        if event_name in state.meters_by_event:
            raise invalid_request(
                f"An active meter with event_name '{event_name}' already exists.",
                param="event_name",
            )
        meter = Meter(
            id=new_id("mtr"),
            display_name=display_name,
            event_name=event_name,
            formula=formula,
            customer_key=customer_key,
            value_key=value_key or "value",
            created=state.clock.now(),
        )
        state.meters[meter.id] = meter
        state.meters_by_event[event_name] = meter
        return render_meter(meter)


def retrieve_meter(state: EmulatorState, meter_id: str) -> dict[str, Any]:
    return render_meter(find_meter(state, meter_id))


def list_meters(state: EmulatorState, params: Params) -> dict[str, Any]:
    check_known(params, {"limit", "starting_after", "ending_before", "status"})
    status = optional_str(params, "status")
    with state.lock:
        meters = sorted(state.meters.values(), key=lambda m: m.created, reverse=True)
        rows = [render_meter(m) for m in meters if status is None or m.status == status]
    return paginate(rows, params, "/v1/billing/meters")


def set_meter_status(state: EmulatorState, meter_id: str, *, active: bool) -> dict[str, Any]:
    """``POST /v1/billing/meters/{id}/deactivate`` and ``/reactivate``."""
    with state.lock:
        meter = find_meter(state, meter_id)
        meter.status = "active" if active else "inactive"
        meter.deactivated_at = None if active else state.clock.now()
        return render_meter(meter)


def find_meter(state: EmulatorState, meter_id: str) -> Meter:
    with state.lock:
        meter = state.meters.get(meter_id)
    if meter is None:
        raise resource_missing("billing.meter", meter_id)
    return meter


def render_meter(meter: Meter) -> dict[str, Any]:
    return {
        "id": meter.id,
        "object": "billing.meter",
        "created": meter.created,
        "customer_mapping": {"event_payload_key": meter.customer_key, "type": "by_id"},
        "default_aggregation": {"formula": meter.formula},
        "display_name": meter.display_name,
        "event_name": meter.event_name,
        "event_time_window": None,
        "livemode": False,
        "status": meter.status,
        "status_transitions": {"deactivated_at": meter.deactivated_at},
        "updated": meter.created,
        "value_settings": {"event_payload_key": meter.value_key},
    }


def list_event_summaries(state: EmulatorState, meter_id: str, params: Params) -> dict[str, Any]:
    """Aggregates by the events' ``timestamp`` over [start_time, end_time), per window.

    Only windows holding at least one counted event are returned, oldest first. An event (or
    its cancellation) shows only ``summary_lag_s`` after Stripe received it.
    """
    check_known(
        params,
        {
            "customer",
            "start_time",
            "end_time",
            "value_grouping_window",
            "limit",
            "starting_after",
            "ending_before",
        },
    )
    meter = find_meter(state, meter_id)
    customer = required_str(params, "customer")
    start, end = required_int(params, "start_time"), required_int(params, "end_time")
    window = optional_str(params, "value_grouping_window")
    step = _window_step(window, start, end)
    with state.lock:
        series = list(state.events_by_series.get((meter.id, customer), ()))
        # Stripe aggregates asynchronously: summaries are eventually consistent.
        seen_at = state.clock.now() - state.settings.summary_lag_s
    buckets: dict[int, list[MeterEvent]] = {}
    for event in series:
        if event.counts_at(seen_at) and start <= event.timestamp < end:
            bucket = start + (event.timestamp - start) // step * step
            buckets.setdefault(bucket, []).append(event)
    rows = [
        _summary(meter, customer, bucket, min(bucket + step, end), buckets[bucket])
        for bucket in sorted(buckets)
    ]
    return paginate(rows, params, f"/v1/billing/meters/{meter.id}/event_summaries")


def _window_step(window: str | None, start: int, end: int) -> int:
    if window is not None and window not in WINDOWS_S:
        raise invalid_request(
            "Invalid value_grouping_window: must be one of day, hour",
            param="value_grouping_window",
        )
    align = WINDOWS_S[window] if window else MINUTE_S
    for name, value in (("start_time", start), ("end_time", end)):
        if value % align:
            unit = window or "minute"
            raise invalid_request(
                f"{name} must be aligned to {unit} boundaries ({align} seconds).", param=name
            )
    if end <= start:
        raise invalid_request("end_time must be after start_time.", param="end_time")
    return WINDOWS_S[window] if window else end - start


def _summary(
    meter: Meter, customer: str, start: int, end: int, events: list[MeterEvent]
) -> dict[str, Any]:
    digest = hashlib.sha256(f"{meter.id}|{customer}|{start}|{end}".encode()).hexdigest()[:24]
    return {
        "id": f"mtrusm_{digest}",
        "object": "billing.meter_event_summary",
        "aggregated_value": aggregate(meter.formula, events),
        "end_time": end,
        "livemode": False,
        "meter": meter.id,
        "start_time": start,
    }


def aggregate(formula: str, events: list[MeterEvent]) -> int:
    """The meter's formula over ``events`` (all counted); 0 for none."""
    if not events:
        return 0
    if formula == "count":
        return len(events)
    if formula == "last":
        return max(events, key=lambda e: (e.timestamp, e.received_at)).value
    return sum(event.value for event in events)
