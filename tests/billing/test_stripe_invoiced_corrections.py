"""Issue #20: corrections that respect finalized invoices, asserted on what Stripe invoiced.

Each test ends with the customer's finalized invoices minus their credit notes equal to the
ledger's billed amount per period (one meter unit = 10,000 micros = one minor unit of the
invoice's currency, EUR here, so nothing is USD by accident).
"""

from __future__ import annotations

from datetime import UTC, datetime

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


def test_correction_across_a_finalized_boundary_goes_to_the_open_period_and_a_credit_note(
    engine, stripe_settings, db, control, link, sdk, webhook_api
):
    invoicing = start_invoicing(
        stripe_settings, control, webhook_api, emulator={"default_currency": "eur"}
    )
    settings, clocks = invoicing.settings, invoicing.clocks
    big_run(engine, settings, "run-a", "cust-a")  # 1,200,000 micros: 120 units
    stripe_id = link("cust-a")
    pusher = invoicing.pusher(engine)
    drain(pusher, engine)
    finalize_month_of(START, clocks, engine, settings)

    # Late usage of the run: its month is invoiced, so the increase is dated now (open).
    late_usage(engine, settings, "run-a", "cust-a")
    drain(pusher, engine)
    (increase,) = [e for e in control.state()["meter_events"] if e["identifier"].endswith(":v2")]
    assert period_of(increase["timestamp"]) != DECEMBER

    # Then a credit of 500,000: the fresh increase is cancelled, the other 200,000 is a
    # credit note on December's invoice, in its currency, before payment.
    credit(engine, settings, "run-a", 500_000, datetime.now(UTC))
    drain(pusher, engine)
    finalize_month_of(clocks.now(), clocks, engine, settings)

    assert invoiced_minor(sdk, stripe_id) == billed_minor(db, "cust-a") == {DECEMBER: 100}
    (note,) = sdk.v1.credit_notes.list(params={"customer": stripe_id}).data
    assert (note.currency, note.amount, note.pre_payment_amount) == ("eur", 20, 20)
    customer = sdk.v1.customers.retrieve(stripe_id)
    balances = customer.to_dict().get("invoice_credit_balance") or {}
    assert customer.balance == 0 and not any(balances.values())


def test_decrease_after_payment_is_a_refunding_credit_note_issued_exactly_once(
    engine, stripe_settings, db, control, link, sdk, webhook_api
):
    invoicing = start_invoicing(
        stripe_settings, control, webhook_api, emulator={"default_currency": "eur"}
    )
    settings, clocks = invoicing.settings, invoicing.clocks
    big_run(engine, settings, "run-b", "cust-b")
    stripe_id = link("cust-b")
    pusher = invoicing.pusher(engine)
    drain(pusher, engine)
    finalize_month_of(START, clocks, engine, settings)
    (invoice,) = sdk.v1.invoices.list(params={"customer": stripe_id}).data
    control.pay_invoice(invoice.id)
    handle_webhooks(engine, settings)

    # The credit note's reply is lost after Stripe created it: the retry finds it.
    control.inject_faults(next=["drop_after_commit"], path="/v1/credit_notes", method="POST")
    credit(engine, settings, "run-b", 200_000, datetime.now(UTC))
    drain(pusher, engine)

    assert invoiced_minor(sdk, stripe_id) == billed_minor(db, "cust-b") == {DECEMBER: 100}
    (note,) = sdk.v1.credit_notes.list(params={"customer": stripe_id}).data
    assert (note.invoice, note.currency, note.amount) == (invoice.id, "eur", 20)
    assert (note.pre_payment_amount, note.post_payment_amount) == (0, 20)
    assert [r["amount_refunded"] for r in note.to_dict()["refunds"]] == [20]
    assert note.customer_balance_transaction is None  # refunded, not a balance credit
    recorded = db.execute(
        "SELECT kind, invoice_id, currency, amount_minor, micros FROM stripe_deliveries "
        "WHERE kind = 'credit_note'"
    ).fetchall()
    assert recorded == [("credit_note", invoice.id, "eur", 20, -200_000)]
