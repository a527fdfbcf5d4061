"""Stripe keeps one customer balance per currency; a credit pays only invoices in its currency."""

from __future__ import annotations

import pytest
import stripe

from devtools.stripe_emulator.control_client import EmulatorControl
from tests.devtools.stripe_emulator.invoicing_harness import (
    FEB_1,
    HOUR_S,
    JAN_1,
    MAR_1,
    at,
    invoices_of,
    send_usage,
)

pytestmark = pytest.mark.usefixtures("auto_subscribe")


def _adjust(client: stripe.StripeClient, customer_id: str, amount: int, currency: str) -> None:
    client.v1.customers.balance_transactions.create(
        customer_id, params={"amount": amount, "currency": currency}
    )


def test_customer_keeps_one_balance_per_currency(
    client: stripe.StripeClient, customer: stripe.Customer
) -> None:
    _adjust(client, customer.id, -500, "usd")
    _adjust(client, customer.id, -700, "eur")
    _adjust(client, customer.id, 200, "eur")

    fetched = client.v1.customers.retrieve(customer.id)
    txns = client.v1.customers.balance_transactions.list(customer.id).data

    assert (fetched.currency, fetched.balance) == ("usd", -500)  # the default currency's
    assert fetched.invoice_credit_balance.to_dict() == {"usd": 500, "eur": 500}
    assert [(t.currency, t.ending_balance) for t in txns] == [
        ("eur", -500),
        ("eur", -700),
        ("usd", -500),
    ]


def test_balance_credit_applies_only_to_the_next_invoice_in_its_currency(
    client: stripe.StripeClient,
    control: EmulatorControl,
    meter: stripe.billing.Meter,
    customer: stripe.Customer,
) -> None:
    control.subscribe(customer.id, currency="eur", unit_amount=10, start=JAN_1)
    _adjust(client, customer.id, -30, "usd")  # a dollar credit: never touches euro invoices
    control.set_clock(at(2026, 1, 20), frozen=True)
    send_usage(client, customer.id, 5, timestamp=at(2026, 1, 19), identifier="j1")
    control.set_clock(FEB_1 + HOUR_S, frozen=True)
    _adjust(client, customer.id, -20, "eur")
    control.set_clock(at(2026, 2, 20), frozen=True)
    send_usage(client, customer.id, 5, timestamp=at(2026, 2, 19), identifier="f1")

    control.set_clock(MAR_1 + HOUR_S, frozen=True)

    by_month = {i.period_start: i for i in invoices_of(client, customer.id)}
    january, february = by_month[JAN_1], by_month[FEB_1]
    assert (january.currency, january.starting_balance, january.amount_due) == ("eur", 0, 50)
    assert (february.starting_balance, february.ending_balance) == (-20, 0)
    assert (february.total, february.amount_due) == (50, 30)
    balances = client.v1.customers.retrieve(customer.id).invoice_credit_balance
    assert balances.to_dict() == {"usd": 30, "eur": 0}


def test_credit_larger_than_the_invoice_carries_over(
    client: stripe.StripeClient,
    control: EmulatorControl,
    meter: stripe.billing.Meter,
    customer: stripe.Customer,
) -> None:
    _adjust(client, customer.id, -8, "usd")
    control.set_clock(at(2026, 1, 20), frozen=True)
    send_usage(client, customer.id, 5, timestamp=at(2026, 1, 19), identifier="j1")

    control.set_clock(FEB_1 + HOUR_S, frozen=True)

    (invoice,) = invoices_of(client, customer.id)
    assert (invoice.amount_due, invoice.ending_balance, invoice.status) == (0, -3, "paid")
    assert client.v1.customers.retrieve(customer.id).balance == -3
