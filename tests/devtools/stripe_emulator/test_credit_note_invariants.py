"""Whatever credit notes are tried on an invoice, what was credited and what is still due add up."""

from __future__ import annotations

import stripe
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devtools.stripe_emulator import EmulatorServer
from devtools.stripe_emulator.control_client import EmulatorControl
from tests.devtools.stripe_emulator.invoicing_harness import (
    EVENT_NAME,
    FEB_1,
    HOUR_S,
    at,
    invoices_of,
    send_usage,
)

TOTAL = 10


def _open_invoice(client: stripe.StripeClient, control: EmulatorControl, *, paid: bool) -> str:
    control.reset()
    control.settings(auto_subscribe=True)  # a convenience: invoices, not subscribing, are tested
    client.v1.billing.meters.create(
        params={
            "display_name": "u",
            "event_name": EVENT_NAME,
            "default_aggregation": {"formula": "sum"},
        }
    )
    customer = client.v1.customers.create(params={"name": "c"})
    control.set_clock(at(2026, 1, 20), frozen=True)
    send_usage(client, customer.id, TOTAL, timestamp=at(2026, 1, 19), identifier="u")
    control.set_clock(FEB_1 + HOUR_S, frozen=True)
    (invoice,) = invoices_of(client, customer.id)
    if paid:
        control.pay_invoice(invoice.id)
    return invoice.id


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(amounts=st.lists(st.integers(min_value=1, max_value=7), max_size=5), paid=st.booleans())
def test_credited_plus_due_equals_the_invoice_total(
    server: EmulatorServer,
    client: stripe.StripeClient,
    control: EmulatorControl,
    amounts: list[int],
    paid: bool,
) -> None:
    invoice_id = _open_invoice(client, control, paid=paid)
    accepted = []
    for amount in amounts:
        split = {"out_of_band_amount": amount} if paid else {}
        try:
            client.v1.credit_notes.create(params={"invoice": invoice_id, "amount": amount, **split})  # type: ignore[arg-type]
        except stripe.InvalidRequestError:
            continue
        accepted.append(amount)

    invoice = client.v1.invoices.retrieve(invoice_id)
    credited = invoice.pre_payment_credit_notes_amount + invoice.post_payment_credit_notes_amount
    assert credited == sum(accepted) <= TOTAL
    assert invoice.amount_due + invoice.pre_payment_credit_notes_amount == TOTAL
    assert invoice.amount_remaining == (0 if paid else TOTAL - sum(accepted))
    assert invoice.status == ("paid" if paid or sum(accepted) == TOTAL else "open")
