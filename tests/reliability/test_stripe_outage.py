"""Issue #8 item 7: Stripe takes meter events and drops the replies, then answers 500s.

A real worker settles the runs and pushes the outbox (after each settlement and on beat)
to the Stripe emulator. First every meter event is stored and its reply dropped; then every
call fails with 500 for ``OUTAGE_S`` (the issue asks for a minute; 15 s keeps the suite
short and still spans many push rounds and backoffs). After recovery every billed run is in
Stripe exactly once: the retries reuse each call's idempotency key and identifier.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import stripe

from devtools.stripe_emulator import EmulatorServer
from devtools.stripe_emulator.control_client import EmulatorControl
from metering.billing.gateway import StripeGateway
from metering.billing.service import link_customer
from tests.helpers.ingest import ingest
from tests.helpers.processes import wait_until
from tests.reliability.books import Workload, all_settled, check_books, settled_runs

START = datetime.now(UTC) - timedelta(minutes=30)
OUTAGE_S = 15
RUNS, CUSTOMERS = 200, 10


@pytest.fixture
def emulator() -> Iterator[EmulatorServer]:
    server = EmulatorServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


def pending(db) -> int:
    (count,) = db.execute("SELECT count(*) FROM stripe_outbox WHERE status = 'pending'").fetchone()
    return int(count)


def test_meter_events_dropped_then_500s_with_a_worker_pushing_arrive_exactly_once(
    engine, settings, db, private_redis, stack, emulator
):
    control = EmulatorControl(emulator.url)
    workload = Workload.make(RUNS, CUSTOMERS, START, prefix="stripe")
    for batch in workload.batches(100):
        ingest(engine, settings, batch)
    sdk = stripe.StripeClient("sk_test_x", base_addresses={"api": emulator.url})
    for customer in workload.customers():
        link_customer(engine, "acme", customer, sdk.v1.customers.create().id)
    stripe_settings = settings.model_copy(update={"stripe_api_base": emulator.url})
    StripeGateway(stripe_settings).meter_id(create=True)
    env = stack.env(
        settings,
        private_redis.url(),
        FAIRMETER_STRIPE_API_BASE=emulator.url,
        FAIRMETER_STRIPE_MAX_NETWORK_RETRIES="0",
        FAIRMETER_STRIPE_TIMEOUT_S="2",
        FAIRMETER_STRIPE_BACKOFF_BASE_S="0.2",
        FAIRMETER_STRIPE_BACKOFF_MAX_S="2",
        FAIRMETER_STRIPE_PUSH_INTERVAL_S="1",
        FAIRMETER_STRIPE_PUSH_LEASE_S="30",
    )
    control.inject_faults(rate=1.0, kinds=["drop_after_commit"], path="/v1/billing/meter_events")
    try:
        stack.worker(env)
        stack.beat(env)
        assert wait_until(lambda: all_settled(db, RUNS), timeout_s=60), settled_runs(db)

        def stored_unanswered() -> bool:
            return control.state()["counters"].get("fault:drop_after_commit", 0) >= 30

        assert wait_until(stored_unanswered, timeout_s=60), control.state()["counters"]
        control.inject_faults(rate=1.0, kinds=["500"])
        time.sleep(OUTAGE_S)
        assert pending(db) > 0, "everything was sent before the outage was over"
    finally:
        control.clear_faults()
    recovering = time.monotonic()
    assert wait_until(lambda: pending(db) == 0, timeout_s=90), pending(db)
    recovery_s = time.monotonic() - recovering
    state = control.state()
    faults = {k: v for k, v in state["counters"].items() if k.startswith(("fault:", "idem"))}
    print(
        f"\n[faults] stripe: {faults}; meter events {len(state['meter_events'])}; "
        f"outbox drained {recovery_s:.1f}s after recovery"
    )
    # Retries kept coming through the outage, on the backoff schedule, and the backlog was
    # sent well within one push lease (30 s) of recovery: no customer waited out a lease.
    assert faults.get("fault:500", 0) >= 20, faults
    assert recovery_s < 20, recovery_s
    identifiers = Counter(e["identifier"] for e in state["meter_events"])
    assert max(identifiers.values()) == 1, "an identifier reached Stripe twice"
    live = [e for e in state["meter_events"] if not e.get("cancelled")]
    billed = db.execute(
        "SELECT c.stripe_customer_id, sum(r.billed_micros) FROM runs r JOIN customers c "
        "ON c.tenant_id = r.tenant_id AND c.id = r.customer_id WHERE r.billed_micros > 0 "
        "GROUP BY 1"
    ).fetchall()
    totals: Counter[str] = Counter()
    for event in live:
        totals[event["customer"]] += int(event["value"])
    assert dict(totals) == {customer: int(total) for customer, total in billed}
    (billed_runs,) = db.execute("SELECT count(*) FROM runs WHERE billed_micros > 0").fetchone()
    assert len(live) == billed_runs
    statuses = dict(db.execute("SELECT status, count(*) FROM stripe_outbox GROUP BY 1").fetchall())
    assert set(statuses) == {"sent"}, statuses
    check_books(db, workload)
