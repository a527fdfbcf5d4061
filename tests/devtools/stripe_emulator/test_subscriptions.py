"""Subscriptions: Stripe bills no one without one, and bills monthly from its billing-cycle
anchor (the month's last day when the anchor's day does not exist in it)."""

from __future__ import annotations

import stripe

from devtools.stripe_emulator.control_client import EmulatorControl
from tests.devtools.stripe_emulator.invoicing_harness import (
    HOUR_S,
    MAR_1,
    at,
    invoices_of,
    send_usage,
)


def _price(client: stripe.StripeClient, meter: stripe.billing.Meter, unit: int) -> str:
    price = client.v1.prices.create(
        params={
            "currency": "usd",
            "unit_amount": unit,
            "product_data": {"name": "usage"},
            "recurring": {"interval": "month", "usage_type": "metered", "meter": meter.id},
        }
    )
    return str(price.id)


def test_a_customer_without_a_subscription_gets_no_invoice(
    client: stripe.StripeClient,
    control: EmulatorControl,
    meter: stripe.billing.Meter,
    customer: stripe.Customer,
) -> None:
    control.set_clock(at(2026, 1, 20), frozen=True)
    send_usage(client, customer.id, 7, timestamp=at(2026, 1, 19), identifier="u1")

    control.set_clock(MAR_1 + 2 * HOUR_S, frozen=True)

    assert invoices_of(client, customer.id) == []


def test_invoices_follow_the_billing_cycle_anchor_to_the_last_day_of_short_months(
    client: stripe.StripeClient,
    control: EmulatorControl,
    meter: stripe.billing.Meter,
    customer: stripe.Customer,
) -> None:
    control.set_clock(at(2026, 1, 10), frozen=True)
    anchor = at(2026, 1, 31, 12)
    subscription = client.v1.subscriptions.create(
        params={
            "customer": customer.id,
            "items": [{"price": _price(client, meter, 2)}],
            "billing_cycle_anchor": anchor,
        }
    )
    control.set_clock(at(2026, 1, 20), frozen=True)
    send_usage(client, customer.id, 3, timestamp=at(2026, 1, 20), identifier="jan")
    control.set_clock(at(2026, 2, 10), frozen=True)
    send_usage(client, customer.id, 5, timestamp=at(2026, 2, 10), identifier="feb")

    control.set_clock(MAR_1 + 2 * HOUR_S, frozen=True)

    invoices = sorted(invoices_of(client, customer.id), key=lambda i: i.period_start)
    assert [(i.period_start, i.period_end, i.total) for i in invoices] == [
        (at(2026, 1, 10), anchor, 3 * 2),
        (anchor, at(2026, 2, 28, 12), 5 * 2),
    ]
    fetched = client.v1.subscriptions.retrieve(subscription.id)
    (item,) = fetched.items.data
    assert (fetched.billing_cycle_anchor, fetched.customer) == (anchor, customer.id)
    assert (item.current_period_start, item.current_period_end) == (
        at(2026, 2, 28, 12),
        at(2026, 3, 31, 12),
    )
