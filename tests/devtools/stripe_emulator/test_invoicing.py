"""Invoices per customer and UTC month: draft at period end, final after the grace, frozen."""

from __future__ import annotations

import time
from collections.abc import Iterator
from decimal import Decimal

import pytest
import stripe

from devtools.stripe_emulator.control_client import EmulatorControl
from tests.devtools.stripe_emulator.invoicing_harness import (
    FEB_1,
    HOUR_S,
    JAN_1,
    MAR_1,
    SNAPSHOT_SECRET,
    Receiver,
    at,
    cancel_usage,
    invoices_of,
    receiver,
    send_usage,
    summed_usage,
    wait_out_summary_lag,
)

pytestmark = pytest.mark.usefixtures("auto_subscribe")


@pytest.fixture
def snapshots(control: EmulatorControl) -> Iterator[Receiver]:
    with receiver() as endpoint:
        control.add_destination(url=endpoint.url, secret=SNAPSHOT_SECRET, style="snapshot")
        yield endpoint


def test_invoice_is_a_draft_at_period_end_and_final_after_the_one_hour_grace(
    client: stripe.StripeClient,
    control: EmulatorControl,
    meter: stripe.billing.Meter,
    customer: stripe.Customer,
    snapshots: Receiver,
) -> None:
    control.set_clock(at(2026, 1, 20), frozen=True)
    send_usage(client, customer.id, 7, timestamp=at(2026, 1, 15), identifier="u1")

    control.set_clock(FEB_1 + 30, frozen=True)
    (draft,) = invoices_of(client, customer.id)
    control.set_clock(FEB_1 + HOUR_S, frozen=True)
    (final,) = invoices_of(client, customer.id)

    assert (draft.status, draft.period_start, draft.period_end) == ("draft", JAN_1, FEB_1)
    assert draft.automatically_finalizes_at == FEB_1 + HOUR_S
    assert (final.id, final.status, final.currency) == (draft.id, "open", "usd")
    assert (final.total, final.amount_due, final.amount_paid) == (7, 7, 0)
    (line,) = final.lines.data
    assert (line.quantity, line.amount, line.period.start, line.period.end) == (7, 7, JAN_1, FEB_1)
    events = snapshots.snapshot_events()
    assert [(e.type, e.data.object["id"]) for e in events] == [
        ("invoice.created", draft.id),
        ("invoice.finalized", draft.id),
    ]
    assert events[1].data.object["status"] == "open"


def test_usage_reported_during_the_grace_counts_on_the_invoice(
    client: stripe.StripeClient,
    control: EmulatorControl,
    meter: stripe.billing.Meter,
    customer: stripe.Customer,
) -> None:
    control.set_clock(at(2026, 1, 31, 23), frozen=True)
    send_usage(client, customer.id, 2, timestamp=at(2026, 1, 31, 22), identifier="u1")
    control.set_clock(FEB_1 + 30 * 60, frozen=True)  # inside the grace

    send_usage(client, customer.id, 3, timestamp=at(2026, 1, 31, 23, 50), identifier="late")
    control.set_clock(FEB_1 + HOUR_S, frozen=True)

    (invoice,) = invoices_of(client, customer.id)
    assert (invoice.status, invoice.total) == ("open", 5)


def test_late_usage_and_cancellations_after_finalization_move_summaries_not_the_invoice(
    client: stripe.StripeClient,
    control: EmulatorControl,
    meter: stripe.billing.Meter,
    customer: stripe.Customer,
) -> None:
    control.set_clock(at(2026, 1, 31, 23), frozen=True)
    send_usage(client, customer.id, 10, timestamp=at(2026, 1, 31, 22), identifier="u1")
    send_usage(client, customer.id, 4, timestamp=at(2026, 1, 31, 22), identifier="u2")
    control.set_clock(FEB_1 + 2 * HOUR_S, frozen=True)  # finalized an hour ago

    send_usage(client, customer.id, 6, timestamp=at(2026, 1, 31, 23, 30), identifier="u3")
    cancel_usage(client, "u2")  # still within 24 h of receipt: Stripe accepts it

    (invoice,) = invoices_of(client, customer.id)
    assert (invoice.status, invoice.total, invoice.lines.data[0].quantity) == ("open", 14, 14)
    wait_out_summary_lag(control)
    assert summed_usage(client, meter.id, customer.id, JAN_1, FEB_1) == 10 + 6


def test_each_month_gets_its_own_invoice_per_customer(
    client: stripe.StripeClient,
    control: EmulatorControl,
    meter: stripe.billing.Meter,
    customer: stripe.Customer,
) -> None:
    other = client.v1.customers.create(params={"name": "Other"})
    control.set_clock(at(2026, 1, 20), frozen=True)
    send_usage(client, customer.id, 1, timestamp=at(2026, 1, 19), identifier="a1")
    send_usage(client, other.id, 9, timestamp=at(2026, 1, 19), identifier="b1")
    control.set_clock(at(2026, 2, 20), frozen=True)
    send_usage(client, customer.id, 2, timestamp=at(2026, 2, 19), identifier="a2")

    control.set_clock(MAR_1 + HOUR_S, frozen=True)

    mine = [(i.period_start, i.total, i.status) for i in invoices_of(client, customer.id)]
    theirs = invoices_of(client, other.id)
    assert mine == [(FEB_1, 2, "open"), (JAN_1, 1, "open")]  # newest first, as Stripe lists
    assert [(i.period_start, i.total) for i in theirs] == [(FEB_1, 0), (JAN_1, 9)]
    assert client.v1.invoices.retrieve(theirs[1].id).customer == other.id


def test_price_per_unit_turns_meter_units_into_minor_units(
    client: stripe.StripeClient,
    control: EmulatorControl,
    meter: stripe.billing.Meter,
    customer: stripe.Customer,
) -> None:
    euro = client.v1.customers.create(params={"name": "Euro"})
    control.settings(unit_amount_minor=3)
    control.subscribe(euro.id, currency="eur", unit_amount=25, start=JAN_1)
    control.set_clock(at(2026, 1, 20), frozen=True)
    send_usage(client, customer.id, 4, timestamp=at(2026, 1, 19), identifier="a1")
    send_usage(client, euro.id, 4, timestamp=at(2026, 1, 19), identifier="e1")

    control.set_clock(FEB_1 + HOUR_S, frozen=True)

    (usd,) = invoices_of(client, customer.id)
    (eur,) = invoices_of(client, euro.id)
    assert (usd.currency, usd.total, usd.lines.data[0].quantity) == ("usd", 12, 4)
    assert (eur.currency, eur.total, eur.lines.data[0].quantity) == ("eur", 100, 4)


def test_invoice_is_paid_on_request_or_automatically_when_configured(
    client: stripe.StripeClient,
    control: EmulatorControl,
    meter: stripe.billing.Meter,
    customer: stripe.Customer,
    snapshots: Receiver,
) -> None:
    control.set_clock(at(2026, 1, 20), frozen=True)
    send_usage(client, customer.id, 5, timestamp=at(2026, 1, 19), identifier="a1")
    control.set_clock(FEB_1 + HOUR_S, frozen=True)
    (january,) = invoices_of(client, customer.id)

    control.pay_invoice(january.id)
    control.settings(auto_pay_after_s=HOUR_S)
    control.set_clock(at(2026, 2, 11), frozen=True)
    send_usage(client, customer.id, 2, timestamp=at(2026, 2, 10), identifier="a2")
    control.set_clock(MAR_1 + 2 * HOUR_S, frozen=True)

    paid = {i.period_start: i for i in invoices_of(client, customer.id)}
    assert (paid[JAN_1].status, paid[JAN_1].amount_paid, paid[JAN_1].amount_remaining) == (
        "paid",
        5,
        0,
    )
    assert (paid[FEB_1].status, paid[FEB_1].amount_paid) == ("paid", 2)
    assert paid[FEB_1].status_transitions.paid_at == MAR_1 + 2 * HOUR_S
    types = [e.type for e in snapshots.snapshot_events()]
    assert types.count("invoice.paid") == 2


def test_an_invoice_with_nothing_due_is_paid_at_finalization(
    client: stripe.StripeClient,
    control: EmulatorControl,
    meter: stripe.billing.Meter,
    customer: stripe.Customer,
) -> None:
    control.set_clock(at(2026, 1, 20), frozen=True)
    send_usage(client, customer.id, 3, timestamp=at(2026, 1, 19), identifier="a1")
    cancel_usage(client, "a1")

    control.set_clock(FEB_1 + HOUR_S, frozen=True)

    (invoice,) = invoices_of(client, customer.id)
    assert (invoice.total, invoice.status) == (0, "paid")


def test_a_negative_cycle_total_is_invoiced_as_quantity_zero(
    client: stripe.StripeClient,
    control: EmulatorControl,
    meter: stripe.billing.Meter,
    customer: stripe.Customer,
) -> None:
    control.settings(allow_negative_values=True)
    control.set_clock(at(2026, 1, 20), frozen=True)
    send_usage(client, customer.id, 3, timestamp=at(2026, 1, 19), identifier="a1")
    send_usage(client, customer.id, -5, timestamp=at(2026, 1, 19), identifier="a2")

    control.set_clock(FEB_1 + HOUR_S, frozen=True)

    (invoice,) = invoices_of(client, customer.id)
    assert (invoice.lines.data[0].quantity, invoice.total) == (0, 0)


def test_usage_received_after_the_finalization_instant_is_left_out_even_if_noticed_later(
    client: stripe.StripeClient,
    control: EmulatorControl,
    meter: stripe.billing.Meter,
    customer: stripe.Customer,
) -> None:
    control.set_clock(at(2026, 1, 31, 23), frozen=True)
    send_usage(client, customer.id, 4, timestamp=at(2026, 1, 31, 22), identifier="on-time")
    control.set_clock(FEB_1 + HOUR_S - 1, frozen=False)  # real seconds tick from here
    time.sleep(2.5)  # the finalization instant passes with nobody asking

    send_usage(client, customer.id, 9, timestamp=at(2026, 1, 31, 23, 59), identifier="too-late")

    (invoice,) = invoices_of(client, customer.id)
    assert (invoice.status, invoice.total) == ("open", 4)


def test_a_fractional_unit_price_bills_the_rounded_product_and_credits_likewise(
    client: stripe.StripeClient,
    control: EmulatorControl,
    meter: stripe.billing.Meter,
    customer: stripe.Customer,
) -> None:
    # One meter unit is a micro-dollar: a ten-thousandth of a cent.
    client.v1.prices.create(
        params={
            "currency": "usd",
            "unit_amount_decimal": "0.0001",
            "product_data": {"name": "usage"},
            "recurring": {"interval": "month", "usage_type": "metered", "meter": meter.id},
        }
    )
    control.set_clock(at(2026, 1, 20), frozen=True)
    send_usage(client, customer.id, 125_000, timestamp=at(2026, 1, 19), identifier="a1")
    control.set_clock(FEB_1 + HOUR_S, frozen=True)

    (invoice,) = invoices_of(client, customer.id)
    (line,) = invoice.lines.data
    note = client.v1.credit_notes.create(
        params={
            "invoice": invoice.id,
            "lines": [
                {"type": "invoice_line_item", "invoice_line_item": line.id, "quantity": 25_000}
            ],
        }
    )

    # $0.125 is 12.5 cents: 13 on the invoice; $0.025 credited is 2.5 cents: 3.
    assert (line.quantity, line.pricing.unit_amount_decimal) == (125_000, Decimal("0.0001"))
    assert (invoice.total, note.amount) == (13, 3)
    assert client.v1.invoices.retrieve(invoice.id).amount_due == 10
