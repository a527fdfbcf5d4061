"""Signed webhook delivery, verified with the SDK's own verification."""

from __future__ import annotations

import json

import pytest
import stripe

from devtools.stripe_emulator import EmulatorServer
from devtools.stripe_emulator.control_client import EmulatorControl
from tests.devtools.stripe_emulator.harness import Inbox, SendEvent

SECRET = "whsec_emulator_test"


def test_invoice_finalized_is_signed_so_the_sdk_verifies_it(
    control: EmulatorControl, inbox: Inbox, customer: stripe.Customer, hour: int
) -> None:
    control.deliver_webhook(
        url=inbox.url,
        secret=SECRET,
        type="invoice.finalized",
        customer=customer.id,
        period_start=hour - 30 * 86400,
        period_end=hour,
    )

    ((body, headers),) = inbox.deliveries
    event = stripe.Webhook.construct_event(
        body.decode(), headers["Stripe-Signature"], SECRET, tolerance=300
    )
    invoice = event.data.object
    assert event.type == "invoice.finalized"
    assert (invoice["customer"], invoice["status"], invoice["period_end"]) == (
        customer.id,
        "open",
        hour,
    )


def test_tampered_payload_fails_verification(control: EmulatorControl, inbox: Inbox) -> None:
    control.deliver_webhook(
        url=inbox.url, secret=SECRET, event={"object": "event", "type": "ping", "data": {}}
    )

    ((body, headers),) = inbox.deliveries
    tampered = json.dumps({**json.loads(body), "type": "invoice.paid"})
    with pytest.raises(stripe.SignatureVerificationError):
        stripe.Webhook.construct_event(tampered, headers["Stripe-Signature"], SECRET)
    with pytest.raises(stripe.SignatureVerificationError):
        stripe.Webhook.construct_event(body.decode(), headers["Stripe-Signature"], "whsec_other")


def test_same_event_can_be_delivered_several_times(
    control: EmulatorControl, inbox: Inbox, customer: stripe.Customer
) -> None:
    control.settings(webhook_url=inbox.url, webhook_secret=SECRET)

    result = control.deliver_webhook(type="invoice.finalized", customer=customer.id, times=3)

    ids = {json.loads(body)["id"] for body, _ in inbox.deliveries}
    assert ids == {result["event"]["id"]} and len(inbox.deliveries) == 3
    assert [d["status"] for d in result["deliveries"]] == [200, 200, 200]


def test_meter_error_report_is_a_thin_event_whose_full_event_names_the_failed_requests(
    client: stripe.StripeClient,
    control: EmulatorControl,
    inbox: Inbox,
    send_event: SendEvent,
    meter: stripe.billing.Meter,
    server: EmulatorServer,
) -> None:
    send_event("run:1:v1", 5, customer_id="cus_missing", key="outbox:1")

    control.deliver_webhook(
        url=inbox.url, secret=SECRET, type="v1.billing.meter.error_report_triggered"
    )

    ((body, headers),) = inbox.deliveries
    notification = client.parse_event_notification(body, headers["Stripe-Signature"], SECRET)
    assert notification.type == "v1.billing.meter.error_report_triggered"
    assert notification.related_object.id == meter.id  # type: ignore[attr-defined]
    full = notification.fetch_event()
    (error_type,) = full.data.reason.error_types  # type: ignore[attr-defined]
    assert error_type.code == "meter_event_customer_not_found"
    assert [s.request.identifier for s in error_type.sample_errors] == ["outbox:1"]
