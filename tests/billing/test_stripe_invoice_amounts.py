"""Issue #29 §3–§5: invoices − credit notes equal the ledger per customer and period when a
refund meets a balance-paid invoice, a decrease spans two invoices, and credits are not
whole minor units (EUR, one meter unit = 10,000 micros = one euro cent)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from metering.billing.service import handle_webhooks
from tests.billing.harness import (
    START,
    away_from_a_month_end,
    big_run,
    billed_minor,
    credit,
    drain,
    finalize_month_of,
    invoiced_minor,
    late_usage,
    period_of,
    start_invoicing,
)

pytestmark = away_from_a_month_end()
DECEMBER = START.strftime("%Y-%m")
EUR = {"default_currency": "eur"}


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
