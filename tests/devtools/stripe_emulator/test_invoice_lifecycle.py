"""Invoices after finalization: credit notes capped per line, voiding, deleted customers, and
the invoice's lines as Stripe lists them (first page embedded, the rest paged)."""

from __future__ import annotations

import pytest
import stripe

from devtools.stripe_emulator.control_client import EmulatorControl
from tests.devtools.stripe_emulator.invoicing_harness import (
    FEB_1,
    HOUR_S,
    at,
    invoices_of,
    send_usage,
)

pytestmark = pytest.mark.usefixtures("auto_subscribe")


def _meter(client: stripe.StripeClient, event_name: str) -> str:
    meter = client.v1.billing.meters.create(
        params={
            "display_name": event_name,
            "event_name": event_name,
            "default_aggregation": {"formula": "sum"},
        }
    )
    return str(meter.id)


def _january_invoice(
    client: stripe.StripeClient, control: EmulatorControl, customer_id: str, usage: dict[str, int]
) -> stripe.Invoice:
    """The finalized January invoice of ``customer_id`` for ``usage`` (event name → units)."""
    control.set_clock(at(2026, 1, 20), frozen=True)
    for name, units in usage.items():
        send_usage(
            client, customer_id, units, timestamp=at(2026, 1, 19), identifier=name, event_name=name
        )
    control.set_clock(FEB_1 + HOUR_S, frozen=True)
    (invoice,) = invoices_of(client, customer_id)
    return invoice


def _credit_line(
    client: stripe.StripeClient, invoice: stripe.Invoice, line_id: str, amount: int
) -> stripe.CreditNote:
    return client.v1.credit_notes.create(
        params={
            "invoice": invoice.id,
            "lines": [
                {"type": "invoice_line_item", "invoice_line_item": line_id, "amount": amount}
            ],
        }
    )


def test_a_line_cannot_be_credited_beyond_what_is_left_on_it(
    client: stripe.StripeClient, control: EmulatorControl, customer: stripe.Customer
) -> None:
    _meter(client, "tokens")
    _meter(client, "seconds")
    invoice = _january_invoice(client, control, customer.id, {"tokens": 10, "seconds": 5})
    tokens = next(line for line in invoice.lines.data if line.quantity == 10)

    _credit_line(client, invoice, tokens.id, 8)
    with pytest.raises(stripe.InvalidRequestError) as refused:
        _credit_line(client, invoice, tokens.id, 4)  # 12 of the line's 10; the invoice has 15
    _credit_line(client, invoice, tokens.id, 2)

    assert "can still be credited on it (2)" in refused.value.user_message
    assert client.v1.invoices.retrieve(invoice.id).amount_due == 15 - 10


def test_only_an_open_invoice_can_be_voided_and_a_void_one_takes_no_credit_note(
    client: stripe.StripeClient, control: EmulatorControl, customer: stripe.Customer
) -> None:
    _meter(client, "tokens")
    invoice = _january_invoice(client, control, customer.id, {"tokens": 10})

    voided = client.v1.invoices.void_invoice(invoice.id)
    with pytest.raises(stripe.InvalidRequestError) as credit:
        client.v1.credit_notes.create(params={"invoice": invoice.id, "amount": 1})
    with pytest.raises(stripe.InvalidRequestError) as again:
        client.v1.invoices.void_invoice(invoice.id)

    assert voided.status == "void"
    assert "is void" in credit.value.user_message
    assert "only void open" in again.value.user_message


def test_a_deleted_customers_later_meter_events_fail_as_customer_not_found(
    client: stripe.StripeClient, control: EmulatorControl, customer: stripe.Customer
) -> None:
    _meter(client, "tokens")
    control.set_clock(at(2026, 1, 20), frozen=True)
    send_usage(
        client, customer.id, 3, timestamp=at(2026, 1, 19), identifier="before", event_name="tokens"
    )

    deleted = client.v1.customers.delete(customer.id)
    accepted = send_usage(
        client, customer.id, 4, timestamp=at(2026, 1, 19), identifier="after", event_name="tokens"
    )

    assert deleted.deleted is True
    assert accepted.identifier == "after"  # async validation: 200 now, reported later
    errors = {e["identifier"]: e["error_code"] for e in control.state()["meter_events"]}
    assert errors == {"before": None, "after": "meter_event_customer_not_found"}
    with pytest.raises(stripe.InvalidRequestError):
        client.v1.customers.retrieve(customer.id)


def test_an_invoice_embeds_its_first_ten_lines_and_pages_the_rest(
    client: stripe.StripeClient, control: EmulatorControl, customer: stripe.Customer
) -> None:
    names = [f"m{n:02d}" for n in range(12)]  # with the fixture's meter: 13 lines
    for name in names:
        _meter(client, name)
    invoice = _january_invoice(client, control, customer.id, {name: 1 for name in names})

    embedded = invoice.lines
    rest = client.v1.invoices.line_items.list(
        invoice.id, params={"limit": 10, "starting_after": embedded.data[-1].id}
    )
    every = list(client.v1.invoices.line_items.list(invoice.id).auto_paging_iter())

    assert (len(embedded.data), embedded.has_more, embedded.url) == (
        10,
        True,
        f"/v1/invoices/{invoice.id}/lines",
    )
    assert (len(rest.data), rest.has_more) == (3, False)
    assert len({line.id for line in every}) == 13
    assert invoice.total == 12
