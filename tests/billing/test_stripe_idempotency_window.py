"""Issue #20: Stripe's idempotency window. A 5xx stored under a key is replayed on every
retry, and past 24 h a key (and a meter event's identifier) no longer protects a retry. Both
cases are reconciled against Stripe's summaries before anything is resent, and resends go
out under a new key and identifier; the invoice ends equal to the ledger either way.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from metering.billing.push import Pusher
from metering.settlement.runner import settle_due_now
from tests.billing.harness import drain
from tests.billing.invoicing import (
    Clocks,
    away_from_a_month_end,
    billed_minor,
    finalize_month_of,
    invoiced_minor,
    invoicing_settings,
)
from tests.billing.test_stripe_corrections import START, big_run
from tests.helpers.events import event, usage
from tests.helpers.ingest import ingest

pytestmark = away_from_a_month_end()
METER_EVENTS = "/v1/billing/meter_events"


def small_run(engine: Any, settings: Any, run: str, customer: str) -> None:
    """One step of 600,000 micros, completed (a different amount from ``big_run``)."""
    ingest(
        engine,
        settings,
        [
            usage(
                run=run,
                customer=customer,
                step=1,
                input_tokens=100_000,
                output_tokens=20_000,
                time=START + timedelta(minutes=1),
            ),
            event(
                run=run, customer=customer, type="run.completed", time=START + timedelta(minutes=2)
            ),
        ],
    )
    settle_due_now(engine, settings, now=datetime.now(UTC))


def identifiers(control: Any) -> list[str]:
    return sorted(e["identifier"] for e in control.state()["meter_events"] if not e["cancelled"])


def test_replayed_500_is_reconciled_landed_or_resent_under_a_new_identifier(
    engine, stripe_settings, db, control, link, sdk
):
    billing = invoicing_settings(stripe_settings)
    clocks = Clocks(control)
    clocks.start()
    pusher = Pusher(engine, billing, clock=clocks.clock)
    big_run(engine, billing, "run-landed", "cust-d")
    stripe_id = link("cust-d")
    # Stripe commits the event but stores a 500 under the key: every retry replays it.
    control.inject_faults(next=["stored_500_after_commit"], path=METER_EVENTS)
    drain(pusher, engine)
    small_run(engine, billing, "run-lost", "cust-d")
    # Stripe does nothing but stores a 500 under the key.
    control.inject_faults(next=["stored_500"], path=METER_EVENTS)
    drain(pusher, engine)

    landed, lost = (
        db.execute("SELECT id FROM runs WHERE subject = %s", (run,)).fetchone()[0]
        for run in ("run-landed", "run-lost")
    )
    assert identifiers(control) == sorted([f"run:{landed}:v1", f"run:{lost}:v1:g1"])
    finalize_month_of(START, clocks, engine, billing)
    assert invoiced_minor(sdk, stripe_id) == billed_minor(db, "cust-d")
    assert billed_minor(db, "cust-d") == {START.strftime("%Y-%m"): 180}


def test_retry_after_24_hours_is_reconciled_before_resending_and_billed_once(
    engine, stripe_settings, db, control, link, sdk
):
    billing = invoicing_settings(stripe_settings)
    clocks = Clocks(control)
    clocks.start()
    pusher = Pusher(engine, billing, clock=clocks.clock)
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

    landed, lost = (
        db.execute("SELECT id FROM runs WHERE subject = %s", (run,)).fetchone()[0]
        for run in ("run-landed", "run-lost")
    )
    assert identifiers(control) == sorted([f"run:{landed}:v1", f"run:{lost}:v1:g1"])
    finalize_month_of(START, clocks, engine, billing)
    assert invoiced_minor(sdk, stripe_id) == billed_minor(db, "cust-e")
    assert billed_minor(db, "cust-e") == {START.strftime("%Y-%m"): 180}
