"""Asynchronous validation: 200 now, a thin error report later with counts and capped samples."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import stripe

from devtools.stripe_emulator.control_client import EmulatorControl
from tests.devtools.stripe_emulator.invoicing_harness import (
    DAY_S,
    FEB_1,
    HOUR_S,
    JAN_1,
    THIN_SECRET,
    Receiver,
    at,
    invoices_of,
    receiver,
    send_usage,
    summed_usage,
    wait_out_summary_lag,
)

pytestmark = pytest.mark.usefixtures("auto_subscribe")

NOW = at(2026, 1, 20)


@pytest.fixture
def thin(control: EmulatorControl) -> Iterator[Receiver]:
    control.settings(error_report_delay_s=60)
    control.set_clock(NOW, frozen=True)
    with receiver() as endpoint:
        control.add_destination(url=endpoint.url, secret=THIN_SECRET, style="thin")
        yield endpoint


def _notifications(client: stripe.StripeClient, endpoint: Receiver) -> list[Any]:
    return [
        client.parse_event_notification(body, headers["Stripe-Signature"], THIN_SECRET)
        for body, headers in endpoint.deliveries
    ]


def test_bad_events_get_200_now_and_a_thin_error_report_later(
    client: stripe.StripeClient,
    control: EmulatorControl,
    meter: stripe.billing.Meter,
    customer: stripe.Customer,
    thin: Receiver,
) -> None:
    archived = client.v1.billing.meters.create(
        params={
            "display_name": "old",
            "event_name": "old_usage",
            "default_aggregation": {"formula": "sum"},
        }
    )
    client.v1.billing.meters.deactivate(archived.id)
    when = NOW - HOUR_S
    send_usage(client, "cus_nobody", 1, timestamp=when, identifier="e1", key="k-e1")
    send_usage(client, customer.id, "lots", timestamp=when, identifier="e2", key="k-e2")
    send_usage(client, customer.id, 1, timestamp=NOW - 40 * DAY_S, identifier="e3", key="k-e3")
    send_usage(client, customer.id, 1, timestamp=when, identifier="e4", event_name="old_usage")
    send_usage(client, customer.id, 5, timestamp=when, identifier="good")
    assert thin.deliveries == []  # nothing is reported before the delay

    control.advance_clock(60)

    by_meter = {n.related_object.id: n for n in _notifications(client, thin)}
    assert set(by_meter) == {meter.id, archived.id}
    report = by_meter[meter.id].fetch_event()
    assert report.type == "v1.billing.meter.error_report_triggered"
    reason = report.data.reason
    # Stripe names each sampled request by its idempotency key (the SDK makes one up when
    # the caller gives none), so a caller that wants to map samples back sends its own.
    codes = {
        t.code: (t.error_count, [s.request.identifier for s in t.sample_errors])
        for t in reason.error_types
    }
    assert codes == {
        "meter_event_customer_not_found": (1, ["k-e1"]),
        "meter_event_invalid_value": (1, ["k-e2"]),
        "timestamp_too_far_in_past": (1, ["k-e3"]),
    }
    assert reason.error_count == 3
    archived_codes = [t.code for t in by_meter[archived.id].fetch_event().data.reason.error_types]
    assert archived_codes == ["archived_meter"]
    wait_out_summary_lag(control)
    assert summed_usage(client, meter.id, customer.id, JAN_1, FEB_1) == 5


def test_error_report_counts_every_error_but_caps_the_samples(
    client: stripe.StripeClient,
    control: EmulatorControl,
    meter: stripe.billing.Meter,
    thin: Receiver,
) -> None:
    control.settings(error_report_sample_cap=5)
    for index in range(12):
        send_usage(client, f"cus_missing_{index}", 1, timestamp=NOW, identifier=f"m{index}")

    reports = control.issue_error_reports()["reports"]

    (notification,) = _notifications(client, thin)
    full = client.v2.core.events.retrieve(notification.id)
    (error_type,) = full.data.reason.error_types
    assert reports == [notification.id]
    assert (error_type.code, error_type.error_count, len(error_type.sample_errors)) == (
        "meter_event_customer_not_found",
        12,
        5,
    )
    assert control.issue_error_reports()["reports"] == []  # each failure is reported once


def test_event_for_an_unknown_event_name_is_reported_as_no_meter_found(
    client: stripe.StripeClient,
    control: EmulatorControl,
    customer: stripe.Customer,
    thin: Receiver,
) -> None:
    send_usage(client, customer.id, 1, timestamp=NOW, identifier="x1", event_name="typo")

    control.issue_error_reports()

    (notification,) = _notifications(client, thin)
    assert notification.type == "v1.billing.meter.no_meter_found"
    (error_type,) = notification.fetch_event().data.reason.error_types
    assert (error_type.code, error_type.error_count) == ("no_meter", 1)


def test_rejected_events_never_reach_the_invoice(
    client: stripe.StripeClient,
    control: EmulatorControl,
    meter: stripe.billing.Meter,
    customer: stripe.Customer,
    thin: Receiver,
) -> None:
    send_usage(client, customer.id, 4, timestamp=NOW, identifier="ok")
    send_usage(client, customer.id, "-3", timestamp=NOW, identifier="negative")

    control.set_clock(FEB_1 + HOUR_S, frozen=True)

    (invoice,) = invoices_of(client, customer.id)
    assert invoice.total == 4
    assert len(thin.deliveries) == 1


def test_async_is_the_default_and_sync_mode_refuses_bad_values_when_asked(
    client: stripe.StripeClient, control: EmulatorControl, customer: stripe.Customer, hour: int
) -> None:
    control.reset()
    client.v1.billing.meters.create(
        params={"display_name": "u", "event_name": "u", "default_aggregation": {"formula": "sum"}}
    )
    control.set_clock(hour + 600, frozen=True)
    accepted = send_usage(
        client, customer.id, "lots", timestamp=hour, identifier="a1", event_name="u"
    )

    control.settings(validation_mode="sync")
    with pytest.raises(stripe.InvalidRequestError):
        send_usage(client, customer.id, "lots", timestamp=hour, identifier="s1", event_name="u")
    assert accepted.identifier == "a1"
