"""Issue #29: an error report's unsampled rejections are found by comparing what we sent with
Stripe's summaries. While those summaries lag, another customer's accepted events look
missing too, and were dead-lettered (then resent: billed twice). The report now waits until
the summaries of its hours can be trusted."""

from __future__ import annotations

from typing import Any

from metering.billing.service import handle_webhooks
from tests.billing.harness import (
    away_from_a_month_end,
    big_run,
    drain,
    link_unknown_to_stripe,
    start_invoicing,
)

pytestmark = away_from_a_month_end()
REJECTED_RUNS = 8  # more than the report's five samples


def dead_customers(db: Any) -> list[str]:
    rows = db.execute("SELECT customer_id FROM stripe_outbox WHERE status = 'dead'").fetchall()
    return sorted(customer for (customer,) in rows)


def test_a_report_waits_while_summaries_lag_and_never_rejects_accepted_events(
    engine, stripe_settings, db, control, link, webhook_api
):
    invoicing = start_invoicing(
        stripe_settings,
        control,
        webhook_api,
        emulator={"validation_mode": "async", "summary_lag_s": 600},
    )
    billing = invoicing.settings
    for number in range(REJECTED_RUNS):
        big_run(engine, billing, f"run-a{number}", "cust-a")
    big_run(engine, billing, "run-b", "cust-b")
    link_unknown_to_stripe(engine, "cust-a")  # Stripe takes these, then rejects them all
    link("cust-b")  # taken and counted, but its summary shows it only 10 minutes later
    drain(invoicing.pusher(engine), engine)
    assert control.issue_error_reports()["reports"]

    handle_webhooks(engine, billing)
    assert dead_customers(db) == []  # the report waits: nothing is attributed yet
    unhandled = db.execute(
        "SELECT count(*) FROM stripe_webhook_inbox WHERE handled_at IS NULL"
    ).fetchone()
    assert unhandled == (1,)

    # Hours later: the summaries have caught up and the trust window has passed.
    control.settings(summary_lag_s=0)
    handle_webhooks(engine, billing.model_copy(update={"stripe_summary_trust_s": 0.0}))
    assert dead_customers(db) == ["cust-a"] * REJECTED_RUNS
