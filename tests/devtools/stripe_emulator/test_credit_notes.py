"""Credit notes adjust finalized invoices: before payment they lower what is due, after it they
are refunded, credited to the balance in the invoice's currency, or settled out of band."""

from __future__ import annotations

from typing import Any

import pytest
import stripe

from devtools.stripe_emulator.control_client import EmulatorControl
from tests.devtools.stripe_emulator.invoicing_harness import (
    FEB_1,
    HOUR_S,
    SNAPSHOT_SECRET,
    at,
    invoices_of,
    receiver,
    send_usage,
)

pytestmark = pytest.mark.usefixtures("auto_subscribe")


@pytest.fixture
def invoice(
    client: stripe.StripeClient,
    control: EmulatorControl,
    meter: stripe.billing.Meter,
    customer: stripe.Customer,
) -> stripe.Invoice:
    """January's open invoice for 10 units at 1 minor unit each."""
    control.set_clock(at(2026, 1, 20), frozen=True)
    send_usage(client, customer.id, 10, timestamp=at(2026, 1, 19), identifier="u1")
    control.set_clock(FEB_1 + HOUR_S, frozen=True)
    (january,) = invoices_of(client, customer.id)
    return january


def _credit(client: stripe.StripeClient, **params: Any) -> stripe.CreditNote:
    return client.v1.credit_notes.create(params=params)  # type: ignore[arg-type]


def test_credit_note_before_payment_lowers_what_is_due(
    client: stripe.StripeClient, control: EmulatorControl, invoice: stripe.Invoice
) -> None:
    with receiver() as endpoint:
        control.add_destination(url=endpoint.url, secret=SNAPSHOT_SECRET, style="snapshot")
        note = _credit(client, invoice=invoice.id, amount=4, reason="order_change", memo="m")
        endpoint.wait_for(1)
        (event,) = endpoint.snapshot_events()

    after = client.v1.invoices.retrieve(invoice.id)
    assert (note.object, note.type, note.pre_payment_amount, note.post_payment_amount) == (
        "credit_note",
        "pre_payment",
        4,
        0,
    )
    assert (note.currency, note.memo, note.reason) == ("usd", "m", "order_change")
    assert (after.total, after.amount_due, after.amount_remaining) == (10, 6, 6)
    assert after.pre_payment_credit_notes_amount == 4
    assert (event.type, event.data.object["id"]) == ("credit_note.created", note.id)


def test_credit_note_for_all_that_remains_settles_the_invoice(
    client: stripe.StripeClient, invoice: stripe.Invoice
) -> None:
    _credit(client, invoice=invoice.id, amount=10)

    assert client.v1.invoices.retrieve(invoice.id).status == "paid"


def test_credit_note_after_payment_must_be_refunded_credited_or_out_of_band(
    client: stripe.StripeClient,
    control: EmulatorControl,
    invoice: stripe.Invoice,
    customer: stripe.Customer,
) -> None:
    control.pay_invoice(invoice.id)

    with pytest.raises(stripe.InvalidRequestError) as unsplit:
        _credit(client, invoice=invoice.id, amount=3)
    credit = _credit(client, invoice=invoice.id, amount=3, credit_amount=3)
    refund = _credit(client, invoice=invoice.id, amount=2, refund_amount=1, out_of_band_amount=1)

    after = client.v1.invoices.retrieve(invoice.id)
    assert "post_payment_amount" in str(unsplit.value.user_message)
    assert (credit.type, credit.post_payment_amount) == ("post_payment", 3)
    assert (refund.refunds[0].amount_refunded, refund.out_of_band_amount) == (1, 1)
    assert (after.amount_paid, after.amount_due, after.post_payment_credit_notes_amount) == (
        10,
        10,
        5,
    )
    balance = client.v1.customers.retrieve(customer.id)
    assert (balance.balance, balance.invoice_credit_balance["usd"]) == (-3, 3)
    (txn, *_) = client.v1.customers.balance_transactions.list(customer.id).data
    assert (txn.type, txn.amount, txn.credit_note, txn.currency) == (
        "credit_note",
        -3,
        credit.id,
        "usd",
    )


def test_credit_notes_cannot_exceed_the_invoice_total(
    client: stripe.StripeClient, invoice: stripe.Invoice
) -> None:
    _credit(client, invoice=invoice.id, amount=6)

    with pytest.raises(stripe.InvalidRequestError) as raised:
        _credit(client, invoice=invoice.id, amount=5)

    assert "(4)" in str(raised.value.user_message)
    assert client.v1.invoices.retrieve(invoice.id).amount_due == 4


def test_credit_note_on_a_draft_invoice_is_refused(
    client: stripe.StripeClient,
    control: EmulatorControl,
    meter: stripe.billing.Meter,
    customer: stripe.Customer,
) -> None:
    control.set_clock(at(2026, 1, 20), frozen=True)
    send_usage(client, customer.id, 10, timestamp=at(2026, 1, 19), identifier="u1")
    control.set_clock(FEB_1 + 60, frozen=True)
    (draft,) = invoices_of(client, customer.id)

    with pytest.raises(stripe.InvalidRequestError) as raised:
        _credit(client, invoice=draft.id, amount=1)

    assert (raised.value.http_status, raised.value.param) == (400, "invoice")
    assert list(client.v1.credit_notes.list().auto_paging_iter()) == []


def test_credit_note_with_a_repeated_idempotency_key_is_issued_once(
    client: stripe.StripeClient, invoice: stripe.Invoice
) -> None:
    params = {"invoice": invoice.id, "amount": 2}
    first = client.v1.credit_notes.create(params=params, options={"idempotency_key": "cn-1"})  # type: ignore[arg-type]
    again = client.v1.credit_notes.create(params=params, options={"idempotency_key": "cn-1"})  # type: ignore[arg-type]

    assert first.id == again.id
    assert client.v1.invoices.retrieve(invoice.id).amount_due == 8


def test_credit_note_lines_credit_the_metered_line_by_quantity(
    client: stripe.StripeClient, invoice: stripe.Invoice
) -> None:
    line_id = invoice.lines.data[0].id

    note = _credit(
        client,
        invoice=invoice.id,
        lines=[{"type": "invoice_line_item", "invoice_line_item": line_id, "quantity": 3}],
    )

    assert note.amount == 3
    assert (note.lines.data[0].invoice_line_item, note.lines.data[0].quantity) == (line_id, 3)


def test_credit_notes_are_listed_per_invoice_and_retrieved(
    client: stripe.StripeClient, invoice: stripe.Invoice
) -> None:
    first = _credit(client, invoice=invoice.id, amount=1)
    second = _credit(client, invoice=invoice.id, amount=2)

    listed = client.v1.credit_notes.list(params={"invoice": invoice.id})

    assert [n.id for n in listed.data] == [second.id, first.id]
    assert client.v1.credit_notes.retrieve(first.id).amount == 1
