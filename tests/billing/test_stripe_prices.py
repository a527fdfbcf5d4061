"""Issue #20 gap 1: the invoice line of our meter is found through its price, as in Stripe.

Stripe names no meter on an invoice line: the line carries its price
(``pricing.price_details.price``) and the price's ``recurring.meter`` names the meter. A
customer billed on two metered prices has two lines; a credit note for our usage must go
on our meter's line, whichever comes first.
"""

from __future__ import annotations

from datetime import UTC, datetime

import stripe

from metering.config import Settings
from tests.billing.harness import (
    START,
    away_from_a_month_end,
    big_run,
    billed_minor,
    credit,
    drain,
    finalize_month_of,
    invoiced_minor,
    meter_with_price,
    start_invoicing,
)

pytestmark = away_from_a_month_end()


def test_emulated_prices_name_the_meter_they_bill(sdk: stripe.StripeClient):
    meter_id, price_id = meter_with_price(sdk, "tokens_for_prices")
    fetched = sdk.v1.prices.retrieve(price_id)
    assert fetched.recurring is not None
    assert (fetched.recurring.meter, fetched.recurring.usage_type) == (meter_id, "metered")
    assert price_id in [p.id for p in sdk.v1.prices.list(params={"limit": 100}).data]


def test_credit_note_goes_on_our_meters_line_when_the_customer_has_two_metered_prices(
    engine, stripe_settings: Settings, db, control, link, sdk, webhook_api
):
    invoicing = start_invoicing(
        stripe_settings, control, webhook_api, emulator={"default_currency": "eur"}
    )
    settings, clocks = invoicing.settings, invoicing.clocks
    other_meter, _ = meter_with_price(sdk, "storage_gb_hours")
    our_meter, our_price = meter_with_price(sdk, settings.stripe_meter_event_name)
    big_run(engine, settings, "run-p", "cust-p")  # 120 units
    stripe_id = link("cust-p")
    # The other price's line comes first on the invoice.
    control.subscribe(stripe_id, currency="eur", unit_amount=1, meters=[other_meter, our_meter])
    pusher = invoicing.pusher(engine)
    drain(pusher, engine)
    finalize_month_of(START, clocks, engine, settings)

    credit(engine, settings, "run-p", 200_000, datetime.now(UTC))
    drain(pusher, engine)

    (invoice,) = sdk.v1.invoices.list(params={"customer": stripe_id}).data
    ours = {
        line.id
        for line in invoice.lines.data
        if line.pricing is not None
        and line.pricing.price_details is not None
        and line.pricing.price_details.price == our_price
    }
    assert not any((line.to_dict().get("metadata") or {}) for line in invoice.lines.data)
    (note,) = sdk.v1.credit_notes.list(params={"customer": stripe_id}).data
    assert [line.invoice_line_item for line in note.lines.data] == [next(iter(ours))]
    assert (note.currency, note.amount) == ("eur", 20)
    assert (
        invoiced_minor(sdk, stripe_id)
        == billed_minor(db, "cust-p")
        == {START.strftime("%Y-%m"): 100}
    )


def test_credit_note_finds_our_line_past_the_first_page_of_a_long_invoice(
    engine, stripe_settings: Settings, db, control, link, sdk, webhook_api
):
    """A retrieved invoice embeds only its first lines ("the first handful", with `has_more`);
    our meter's line is the twelfth here, and the credit note still goes on it."""
    invoicing = start_invoicing(
        stripe_settings, control, webhook_api, emulator={"default_currency": "eur"}
    )
    settings, clocks = invoicing.settings, invoicing.clocks
    others = [meter_with_price(sdk, f"other_usage_{n}")[0] for n in range(11)]
    our_meter, our_price = meter_with_price(sdk, settings.stripe_meter_event_name)
    big_run(engine, settings, "run-l", "cust-l")  # 120 units
    stripe_id = link("cust-l")
    control.subscribe(stripe_id, currency="eur", unit_amount=1, meters=[*others, our_meter])
    pusher = invoicing.pusher(engine)
    drain(pusher, engine)
    finalize_month_of(START, clocks, engine, settings)

    credit(engine, settings, "run-l", 200_000, datetime.now(UTC))
    drain(pusher, engine)

    (invoice,) = sdk.v1.invoices.list(params={"customer": stripe_id}).data
    assert invoice.lines.has_more and len(invoice.lines.data) < 12
    lines = sdk.v1.invoices.line_items.list(invoice.id, params={"limit": 100}).data
    (ours,) = [
        line.id
        for line in lines
        if line.pricing is not None
        and line.pricing.price_details is not None
        and line.pricing.price_details.price == our_price
    ]
    (note,) = sdk.v1.credit_notes.list(params={"customer": stripe_id}).data
    assert [line.invoice_line_item for line in note.lines.data] == [ours]
    assert (
        invoiced_minor(sdk, stripe_id)
        == billed_minor(db, "cust-l")
        == {START.strftime("%Y-%m"): 100}
    )
