"""Issue #20 gap 1: the invoice line of our meter is found through its price, as in Stripe.

Stripe names no meter on an invoice line: the line carries its price
(``pricing.price_details.price``) and the price's ``recurring.meter`` names the meter. A
customer billed on two metered prices has two lines; a credit note for our usage must go
on our meter's line, whichever comes first.
"""

from __future__ import annotations

from datetime import UTC, datetime

import stripe

from metering.billing.push import Pusher
from metering.config import Settings
from tests.billing.harness import drain
from tests.billing.invoicing import (
    Clocks,
    away_from_a_month_end,
    billed_minor,
    finalize_month_of,
    invoiced_minor,
    invoicing_settings,
    subscribe_destinations,
)
from tests.billing.test_stripe_corrections import START, big_run, credit

pytestmark = away_from_a_month_end()


def _meter_with_price(sdk: stripe.StripeClient, event_name: str) -> tuple[str, str]:
    meter = sdk.v1.billing.meters.create(
        params={
            "display_name": event_name,
            "event_name": event_name,
            "default_aggregation": {"formula": "sum"},
            "customer_mapping": {"event_payload_key": "stripe_customer_id", "type": "by_id"},
            "value_settings": {"event_payload_key": "value"},
        }
    )
    price = sdk.v1.prices.create(
        params={
            "currency": "eur",
            "unit_amount": 1,
            "product_data": {"name": event_name},
            "recurring": {"interval": "month", "usage_type": "metered", "meter": meter.id},
        }
    )
    return str(meter.id), str(price.id)


def test_emulated_prices_name_the_meter_they_bill(sdk: stripe.StripeClient):
    meter_id, price_id = _meter_with_price(sdk, "tokens_for_prices")
    fetched = sdk.v1.prices.retrieve(price_id)
    assert fetched.recurring is not None
    assert (fetched.recurring.meter, fetched.recurring.usage_type) == (meter_id, "metered")
    assert price_id in [p.id for p in sdk.v1.prices.list(params={"limit": 100}).data]


def test_credit_note_goes_on_our_meters_line_when_the_customer_has_two_metered_prices(
    engine, stripe_settings: Settings, db, control, link, sdk, webhook_api
):
    settings = invoicing_settings(stripe_settings)
    control.settings(default_currency="eur")
    subscribe_destinations(control, webhook_api)
    clocks = Clocks(control)
    clocks.start()
    other_meter, _ = _meter_with_price(sdk, "storage_gb_hours")
    our_meter, our_price = _meter_with_price(sdk, settings.stripe_meter_event_name)
    big_run(engine, settings, "run-p", "cust-p")  # 120 units
    stripe_id = link("cust-p")
    # The other price's line comes first on the invoice.
    control.subscribe(stripe_id, currency="eur", unit_amount=1, meters=[other_meter, our_meter])
    pusher = Pusher(engine, settings, clock=clocks.clock)
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
