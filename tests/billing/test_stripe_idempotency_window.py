"""Issue #20: Stripe's idempotency window. A 5xx stored under a key is replayed on every
retry, and past 24 h a key (and a meter event's identifier) no longer protects a retry. Both
cases are reconciled against Stripe's summaries before anything is resent, and resends go
out under a new key and identifier; the invoice ends equal to the ledger either way.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from tests.billing.harness import (
    START,
    away_from_a_month_end,
    big_run,
    billed_minor,
    drain,
    finalize_month_of,
    invoiced_minor,
    run_id_of,
    small_run,
    start_invoicing,
)

pytestmark = away_from_a_month_end()
METER_EVENTS = "/v1/billing/meter_events"


def identifiers(control: Any) -> list[str]:
    return sorted(e["identifier"] for e in control.state()["meter_events"] if not e["cancelled"])


def test_replayed_500_is_reconciled_landed_or_resent_under_a_new_identifier(
    engine, stripe_settings, db, control, link, sdk
):
    invoicing = start_invoicing(stripe_settings, control)
    billing, clocks = invoicing.settings, invoicing.clocks
    pusher = invoicing.pusher(engine)
    big_run(engine, billing, "run-landed", "cust-d")
    stripe_id = link("cust-d")
    # Stripe commits the event but stores a 500 under the key: every retry replays it.
    control.inject_faults(next=["stored_500_after_commit"], path=METER_EVENTS)
    drain(pusher, engine)
    small_run(engine, billing, "run-lost", "cust-d")
    # Stripe does nothing but stores a 500 under the key.
    control.inject_faults(next=["stored_500"], path=METER_EVENTS)
    drain(pusher, engine)

    landed, lost = run_id_of(db, "run-landed"), run_id_of(db, "run-lost")
    assert identifiers(control) == sorted([f"run:{landed}:v1", f"run:{lost}:v1:g1"])
    finalize_month_of(START, clocks, engine, billing)
    assert invoiced_minor(sdk, stripe_id) == billed_minor(db, "cust-d")
    assert billed_minor(db, "cust-d") == {START.strftime("%Y-%m"): 180}


def test_retry_after_24_hours_is_reconciled_before_resending_and_billed_once(
    engine, stripe_settings, db, control, link, sdk
):
    invoicing = start_invoicing(stripe_settings, control)
    billing, clocks = invoicing.settings, invoicing.clocks
    pusher = invoicing.pusher(engine)
    big_run(engine, billing, "run-landed", "cust-e")
    stripe_id = link("cust-e")
    # Stripe takes the event, the reply is lost, then Stripe fails every retry that round.
    control.inject_faults(next=["drop_after_commit", "500", "500"], path=METER_EVENTS)
    pusher.push_due()
    small_run(engine, billing, "run-lost", "cust-e")
    control.inject_faults(next=["500", "500", "500"], path=METER_EVENTS)
    pusher.push_due()
    assert db.execute("SELECT count(*) FROM stripe_outbox WHERE status = 'pending'").fetchone() == (
        2,
    )

    # A day and an hour later both keys and identifiers have lapsed at Stripe.
    clocks.jump(clocks.now() + timedelta(hours=25))
    drain(pusher, engine)

    landed, lost = run_id_of(db, "run-landed"), run_id_of(db, "run-lost")
    assert identifiers(control) == sorted([f"run:{landed}:v1", f"run:{lost}:v1:g1"])
    finalize_month_of(START, clocks, engine, billing)
    assert invoiced_minor(sdk, stripe_id) == billed_minor(db, "cust-e")
    assert billed_minor(db, "cust-e") == {START.strftime("%Y-%m"): 180}
