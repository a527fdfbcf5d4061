"""Issue #29 §3–§5: invoices − credit notes equal the ledger per customer and period when a
refund meets a balance-paid invoice, a decrease spans two invoices, and credits are not
whole minor units (EUR, one meter unit = 10,000 micros = one euro cent)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from metering.billing.rounding import line_minor
from metering.billing.service import handle_webhooks, link_customer
from tests.billing.harness import (
    START,
    away_from_a_month_end,
    big_run,
    billed_minor,
    create_meter,
    credit,
    drain,
    finalize_month_of,
    invoiced_minor,
    late_usage,
    period_of,
    settle,
    start_invoicing,
    step_usage,
)
from tests.helpers.events import event

pytestmark = away_from_a_month_end()
DECEMBER = START.strftime("%Y-%m")
EUR = {"default_currency": "eur"}
MICRO_PRICE = Decimal("0.0001")  # cents per micro-USD meter unit


def test_full_refund_of_an_invoice_paid_partly_from_the_balance_refunds_the_card_part(
    engine, stripe_settings, db, control, link, sdk, webhook_api
):
    invoicing = start_invoicing(stripe_settings, control, webhook_api, emulator=EUR)
    settings, clocks = invoicing.settings, invoicing.clocks
    big_run(engine, settings, "run-a", "cust-a")  # 120 units
    stripe_id = link("cust-a")
    sdk.v1.customers.balance_transactions.create(
        stripe_id,
        params={"amount": -30, "currency": "eur"},  # a 0.30 EUR credit
    )
    pusher = invoicing.pusher(engine)
    drain(pusher, engine)
    finalize_month_of(START, clocks, engine, settings)
    (invoice,) = sdk.v1.invoices.list(params={"customer": stripe_id}).data
    assert (invoice.total, invoice.amount_due) == (120, 90)
    control.pay_invoice(invoice.id)
    handle_webhooks(engine, settings)

    credit(engine, settings, "run-a", 1_200_000, datetime.now(UTC))  # all of it back
    drain(pusher, engine)

    assert invoiced_minor(sdk, stripe_id) == billed_minor(db, "cust-a") == {}
    (note,) = sdk.v1.credit_notes.list(params={"customer": stripe_id}).data
    assert (note.amount, note.post_payment_amount) == (120, 120)
    assert [r["amount_refunded"] for r in note.to_dict()["refunds"]] == [90]  # the card's
    customer = sdk.v1.customers.retrieve(stripe_id).to_dict()
    assert customer["invoice_credit_balance"] == {"eur": 30}  # the balance's part returns
    assert db.execute("SELECT count(*) FROM stripe_outbox WHERE status = 'dead'").fetchone() == (0,)


def test_a_decrease_spanning_two_invoices_is_credited_on_each(
    engine, stripe_settings, db, control, link, sdk, webhook_api
):
    invoicing = start_invoicing(stripe_settings, control, webhook_api, emulator=EUR)
    settings, clocks = invoicing.settings, invoicing.clocks
    big_run(engine, settings, "run-b", "cust-b")  # 120 units on December's invoice
    stripe_id = link("cust-b")
    pusher = invoicing.pusher(engine)
    drain(pusher, engine)
    finalize_month_of(START, clocks, engine, settings)
    late_usage(engine, settings, "run-b", "cust-b")  # 30 more, dated in January
    drain(pusher, engine)
    clocks.jump(clocks.now() + timedelta(hours=25))  # too old to cancel

    credit(engine, settings, "run-b", 1_500_000, datetime.now(UTC))  # a full refund
    for _ in range(3):
        pusher.push_due()  # December's note now; January's waits for its invoice
    january = finalize_month_of(clocks.now(), clocks, engine, settings)
    drain(pusher, engine)

    assert invoiced_minor(sdk, stripe_id) == billed_minor(db, "cust-b") == {}
    notes = sdk.v1.credit_notes.list(params={"customer": stripe_id}).data
    invoices = {
        i.id: period_of(i.period_start)
        for i in sdk.v1.invoices.list(params={"customer": stripe_id}).data
    }
    assert sorted((invoices[n.invoice], n.amount) for n in notes) == [
        (DECEMBER, 120),
        (period_of(int((january - timedelta(days=2)).timestamp())), 30),
    ]


def test_non_round_partial_credits_in_eur_leave_the_ledger_rounded_down_once(
    engine, stripe_settings, db, control, link, sdk, webhook_api
):
    """1,200,000 − 123,456 − 45,678 micros = 103.0866 cents: 103 invoiced, not 104 (the
    credit remainder used to be carried apart from the meter's and never netted)."""
    invoicing = start_invoicing(stripe_settings, control, webhook_api, emulator=EUR)
    settings, clocks = invoicing.settings, invoicing.clocks
    big_run(engine, settings, "run-c", "cust-c")
    stripe_id = link("cust-c")
    pusher = invoicing.pusher(engine)
    drain(pusher, engine)
    finalize_month_of(START, clocks, engine, settings)

    credit(engine, settings, "run-c", 123_456, datetime.now(UTC))
    drain(pusher, engine)
    credit(engine, settings, "run-c", 45_678, datetime.now(UTC))
    drain(pusher, engine)

    assert invoiced_minor(sdk, stripe_id) == billed_minor(db, "cust-c") == {DECEMBER: 103}
    amounts = sorted(
        n.amount for n in sdk.v1.credit_notes.list(params={"customer": stripe_id}).data
    )
    assert amounts == [4, 13]


def test_a_thousand_sub_cent_credits_are_credited_to_the_cent_on_an_anchored_subscription(
    engine, stripe_settings, db, control, sdk, webhook_api
):
    """One meter unit is one micro-USD (the default), priced 0.0001 ¢ by a real price on a
    subscription anchored mid-period. 1,000 runs are each credited 4,999 micros (0.4999 ¢)
    after the invoice is final: each note alone rounds to 0 ¢ (refused and dead-lettered
    before); together the notes credit what they add up to, and the invoice net of them is
    the ledger priced once."""
    invoicing = start_invoicing(
        stripe_settings,
        control,
        webhook_api,
        # 1,000 credit notes at the sandbox's 25 requests/s would take minutes; the rate
        # limit is not what this test is about (tests/billing/test_stripe_correction_race.py
        # and the rest run with it).
        emulator={
            "auto_subscribe": False,
            "rate_limit_per_s": None,
            "endpoint_rate_limit_per_s": None,
        },
        stripe_meter_unit_micros=1,
        stripe_rate_limit_per_s=1_000.0,
    )
    settings, clocks = invoicing.settings, invoicing.clocks
    stripe_id = sdk.v1.customers.create(params={"name": "cust-0"}).id
    meter = create_meter(sdk, settings.stripe_meter_event_name)
    price = sdk.v1.prices.create(
        params={
            "currency": "usd",
            "unit_amount_decimal": "0.0001",
            "product_data": {"name": "agent usage"},
            "recurring": {"interval": "month", "usage_type": "metered", "meter": meter},
        }
    )
    anchored_at = clocks.now() - timedelta(hours=3)  # before the runs, mid-month
    clocks.jump(anchored_at)
    subscription = sdk.v1.subscriptions.create(
        params={"customer": stripe_id, "items": [{"price": price.id}]}
    )
    clocks.jump(anchored_at + timedelta(hours=3))
    settle(engine, settings, [e for n in range(1_000) for e in one_step_run(f"run-{n}")])
    link_customer(engine, "acme", "cust-0", stripe_id)
    pusher = invoicing.pusher(engine)
    drain(pusher, engine)
    period_end = sdk.v1.subscriptions.retrieve(subscription.id).to_dict()["items"]["data"][0][
        "current_period_end"
    ]
    clocks.jump(datetime.fromtimestamp(period_end, UTC) + timedelta(hours=1, minutes=1))
    control.run_invoicing()
    handle_webhooks(engine, settings)

    for n in range(1_000):
        credit(engine, settings, f"run-{n}", 4_999, datetime.now(UTC))
    drain(pusher, engine, deadline_s=600)

    (invoice,) = sdk.v1.invoices.list(params={"customer": stripe_id}).data
    assert invoice.period_start == int(anchored_at.timestamp())  # the anchor, not the 1st
    notes = sdk.v1.credit_notes.list(params={"customer": stripe_id, "limit": 100})
    credited = sum(note.amount for note in notes.auto_paging_iter())
    (ledger,) = db.execute("SELECT sum(billed_micros) FROM runs").fetchone()
    gross = int(ledger) + 1_000 * 4_999
    assert credited == line_minor(gross, MICRO_PRICE) - line_minor(int(ledger), MICRO_PRICE)
    assert invoice.total - credited == line_minor(int(ledger), MICRO_PRICE)
    assert 499 <= credited <= 500  # 4.999 USD credited to the cent, not 0 and not 10.00
    dead = db.execute("SELECT count(*) FROM stripe_outbox WHERE status = 'dead'").fetchone()
    assert dead == (0,)


def one_step_run(run: str) -> list[dict[str, object]]:
    """A completed run of one 600,000-micro step (0.60 USD) for cust-0."""
    done = event(
        run=run, customer="cust-0", type="run.completed", time=START + timedelta(minutes=2)
    )
    return [step_usage(run, "cust-0", step=1), done]
