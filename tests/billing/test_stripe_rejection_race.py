"""Issue #20 gap 2: an error report that races the pusher sending the very row it names.

Stripe answers a meter event 200 and rejects it later; the report can reach us while the
pusher still waits for that 200 (or is sending the row's later steps). Applied then, it found
no recorded delivery and was dropped: the row ended ``sent`` with usage Stripe never billed.
The report now waits in the inbox until no pusher holds the row, then applies.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from metering.billing.service import handle_webhooks
from tests.billing.harness import big_run, link_unknown_to_stripe, start_invoicing, wait_for

SLOW_S = 6.0  # how long Stripe holds the meter event's 200: the window of the race


def test_rejection_reported_while_the_pusher_awaits_that_rows_reply_applies_after_it_records(
    engine, stripe_settings, db, control, webhook_api
):
    invoicing = start_invoicing(
        stripe_settings,
        control,
        webhook_api,
        emulator={"validation_mode": "async", "slow_s": SLOW_S},
        stripe_timeout_s=60.0,
    )
    billing = invoicing.settings
    big_run(engine, billing, "run-r", "cust-r")
    link_unknown_to_stripe(engine, "cust-r")  # Stripe rejects it later
    control.inject_faults(next=["slow"], path="/v1/billing/meter_events", method="POST")
    pusher = invoicing.pusher(engine)

    with ThreadPoolExecutor(max_workers=1) as pool:
        sending = pool.submit(pusher.push_due)
        # Stripe has the event; the pusher has not had its reply yet.
        wait_for(lambda: len(control.state()["meter_events"]) == 1)
        control.issue_error_reports()
        handle_webhooks(engine, billing)
        assert not sending.done(), f"the race window closed early (slow_s={SLOW_S})"
        (unhandled,) = db.execute(
            "SELECT count(*) FROM stripe_webhook_inbox "
            "WHERE type = 'v1.billing.meter.error_report_triggered' AND handled_at IS NULL"
        ).fetchone()
        assert unhandled == 1  # waits for the pusher instead of being dropped
        assert sending.result(timeout=120).sent_rows == 1

    handle_webhooks(engine, billing)
    (status, error) = db.execute("SELECT status, last_error FROM stripe_outbox").fetchone()
    assert status == "dead" and "meter_event_customer_not_found" in error
    rejected = db.execute(
        "SELECT count(*) FROM stripe_deliveries WHERE kind = 'meter_rejected'"
    ).fetchone()
    assert rejected == (1,)
    assert db.execute(
        "SELECT count(*) FROM stripe_webhook_inbox WHERE handled_at IS NULL"
    ).fetchone() == (0,)
