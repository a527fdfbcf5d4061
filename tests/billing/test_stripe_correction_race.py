"""Issue #29 item 2: a correction settled while a pusher is still sending the old version.

Superseding the old row cleared its claim, and a claim counted only pending rows as busy, so a
second pusher planned the new version without the call still in flight: it sent the whole new
amount on top of the old event it never saw (120 + 60 units invoiced, 60 in the ledger). One
pusher holds a customer now, from planning until the call's result is recorded, so the
correction is planned against what is in flight: the old event cancelled, the new one sent.

The second pusher is another ``Pusher`` on its own thread, not the Celery worker's task: the
worker runs on the wall clock against an emulator whose clock these tests freeze, and it
would need the emulator's settings in its environment; the race is the same two claims.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

from tests.billing.harness import (
    START,
    away_from_a_month_end,
    big_run,
    billed_minor,
    credit,
    drain,
    finalize_month_of,
    invoiced_minor,
    start_invoicing,
    wait_for,
)

pytestmark = away_from_a_month_end()
SLOW_S = 6.0  # how long Stripe holds the old version's meter event: the window of the race


def test_a_correction_settled_while_the_old_version_is_in_flight_bills_the_corrected_amount(
    engine, stripe_settings, db, control, link, sdk, webhook_api
):
    invoicing = start_invoicing(
        stripe_settings,
        control,
        webhook_api,
        emulator={"default_currency": "eur", "slow_s": SLOW_S},
        stripe_timeout_s=60.0,
    )
    settings, clocks = invoicing.settings, invoicing.clocks
    big_run(engine, settings, "run-x", "cust-x")  # 1,200,000 micros: 120 units
    stripe_id = link("cust-x")
    control.inject_faults(next=["slow"], path="/v1/billing/meter_events", method="POST")
    first, second = invoicing.pusher(engine), invoicing.pusher(engine)

    with ThreadPoolExecutor(max_workers=2) as pool:
        sending = pool.submit(first.push_due)
        # Stripe has the 120 units; the first pusher has not had its reply yet.
        wait_for(lambda: len(control.state()["meter_events"]) == 1)
        credit(engine, settings, "run-x", 600_000, datetime.now(UTC))  # version 2: 60 units
        racing = pool.submit(second.push_due).result(timeout=120)
        assert not sending.done(), f"the race window closed early (slow_s={SLOW_S})"
        sent = sending.result(timeout=120)

    drain(second, engine)
    finalize_month_of(START, clocks, engine, settings)

    month = START.strftime("%Y-%m")
    assert invoiced_minor(sdk, stripe_id) == billed_minor(db, "cust-x") == {month: 60}
    (invoice,) = sdk.v1.invoices.list(params={"customer": stripe_id}).data
    assert (invoice.currency, invoice.total) == ("eur", 60)  # €0.60, as the statement says
    # The customer was the first pusher's until it had recorded its call.
    assert (sent.calls, racing.calls) == (1, 0)
