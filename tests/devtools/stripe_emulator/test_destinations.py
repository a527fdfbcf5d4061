"""Each event destination has its own signing secret and payload style (snapshot or thin)."""

from __future__ import annotations

import json

import pytest
import stripe

from devtools.stripe_emulator.control_client import EmulatorControl
from tests.devtools.stripe_emulator.invoicing_harness import (
    FEB_1,
    HOUR_S,
    SNAPSHOT_SECRET,
    THIN_SECRET,
    at,
    receiver,
    send_usage,
)

pytestmark = pytest.mark.usefixtures("auto_subscribe")


def test_snapshot_and_thin_destinations_each_get_their_stream_under_their_own_secret(
    client: stripe.StripeClient,
    control: EmulatorControl,
    meter: stripe.billing.Meter,
    customer: stripe.Customer,
) -> None:
    control.settings(validation_mode="async")
    control.set_clock(at(2026, 1, 31, 23), frozen=True)
    with receiver() as snapshots, receiver() as thin:
        control.add_destination(url=snapshots.url, secret=SNAPSHOT_SECRET, style="snapshot")
        control.add_destination(url=thin.url, secret=THIN_SECRET, style="thin")
        send_usage(client, customer.id, 3, timestamp=at(2026, 1, 31, 22), identifier="ok")
        send_usage(client, "cus_gone", 1, timestamp=at(2026, 1, 31, 22), identifier="bad")

        control.set_clock(FEB_1 + HOUR_S, frozen=True)

        snapshot_types = [e.type for e in snapshots.snapshot_events(SNAPSHOT_SECRET)]
        ((thin_body, thin_headers),) = thin.deliveries
        with pytest.raises(stripe.SignatureVerificationError):
            snapshots.snapshot_events(THIN_SECRET)
        with pytest.raises(stripe.SignatureVerificationError):
            client.parse_event_notification(
                thin_body, thin_headers["Stripe-Signature"], SNAPSHOT_SECRET
            )
        notification = client.parse_event_notification(
            thin_body, thin_headers["Stripe-Signature"], THIN_SECRET
        )

    assert snapshot_types == ["invoice.created", "invoice.finalized"]
    assert notification.type == "v1.billing.meter.error_report_triggered"
    assert "data" not in json.loads(thin_body)  # a thin payload: fetch the event for data
    assert notification.fetch_event().data.reason.error_count == 1


def test_destination_receives_only_the_types_it_asked_for(
    client: stripe.StripeClient,
    control: EmulatorControl,
    meter: stripe.billing.Meter,
    customer: stripe.Customer,
) -> None:
    control.set_clock(at(2026, 1, 20), frozen=True)
    send_usage(client, customer.id, 3, timestamp=at(2026, 1, 19), identifier="u1")
    with receiver() as endpoint:
        control.add_destination(
            url=endpoint.url,
            secret=SNAPSHOT_SECRET,
            style="snapshot",
            types=["invoice.finalized"],
        )

        control.set_clock(FEB_1 + HOUR_S, frozen=True)

        assert [e.type for e in endpoint.snapshot_events()] == ["invoice.finalized"]
    assert control.destinations()["data"][0]["secret"] == "***"
