"""Settled usage reaches Stripe exactly once, through faults, retries and a killed pusher."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter

from metering.db import raw_transaction
from tests.billing.harness import push_all, settled_runs
from tests.helpers import ROOT
from tests.helpers.processes import service_env

CUSTOMERS = 20


def ledger_billed_by_stripe_customer(db) -> dict[str, int]:
    rows = db.execute(
        "SELECT c.stripe_customer_id, sum(r.billed_micros) FROM runs r JOIN customers c "
        "ON c.tenant_id = r.tenant_id AND c.id = r.customer_id GROUP BY 1"
    ).fetchall()
    return {stripe_id: int(total) for stripe_id, total in rows if total}


def live_events(control) -> list[dict]:
    return [e for e in control.state()["meter_events"] if not e.get("cancelled")]


def stripe_totals(control) -> dict[str, int]:
    totals: Counter[str] = Counter()
    for meter_event in live_events(control):
        totals[meter_event["customer"]] += int(meter_event["value"])
    return dict(totals)


def test_2000_runs_arrive_exactly_once_through_30_percent_faults(
    engine, stripe_settings, db, control, link
):
    settled_runs(engine, stripe_settings, runs=2000, customers=CUSTOMERS)
    waiting = db.execute("SELECT count(*) FROM stripe_outbox WHERE status = 'waiting_customer'")
    assert waiting.fetchone()[0] > 0  # no Stripe ids yet: rows wait, visibly
    for i in range(CUSTOMERS):
        link(f"cust-{i}")
    control.settings(timeout_s=0.4)
    control.inject_faults(rate=0.3, kinds=["429", "500", "timeout", "drop_after_commit"], seed=7)
    reports = push_all(engine, stripe_settings, deadline_s=240)
    control.clear_faults()
    state = control.state()
    faults = {k: v for k, v in state["counters"].items() if k.startswith("fault:")}
    assert sum(faults.values()) > 300, faults  # the faults really happened
    assert sum(r.retried for r in reports) > 0
    identifiers = Counter(e["identifier"] for e in state["meter_events"])
    assert max(identifiers.values()) == 1  # no identifier reached Stripe twice
    billed_runs = db.execute("SELECT count(*) FROM runs WHERE billed_micros > 0").fetchone()[0]
    assert len(live_events(control)) == billed_runs
    assert stripe_totals(control) == ledger_billed_by_stripe_customer(db)
    statuses = dict(db.execute("SELECT status, count(*) FROM stripe_outbox GROUP BY 1").fetchall())
    assert set(statuses) == {"sent"}, statuses


def test_pusher_killed_mid_push_then_restarted_sends_exactly_once(
    engine, stripe_settings, settings, db, control, link, emulator
):
    settled_runs(engine, stripe_settings, runs=300, customers=5)
    for i in range(5):
        link(f"cust-{i}")
    control.settings(slow_s=0.05)
    control.inject_faults(rate=1.0, kinds=["slow"], seed=1)  # every call takes a while
    env = service_env(settings) | {
        "FAIRMETER_STRIPE_API_BASE": emulator.url,
        "FAIRMETER_STRIPE_MAX_NETWORK_RETRIES": "0",
        "FAIRMETER_STRIPE_PUSH_LEASE_S": "2",
        "FAIRMETER_STRIPE_BACKOFF_BASE_S": "0.01",
    }
    loop = "from cli.main import run; import sys\nwhile True:\n    sys.argv=['x','stripe','push']\n    try: run()\n    except SystemExit: pass\n"  # noqa: E501
    pusher = subprocess.Popen(
        [sys.executable, "-c", loop], cwd=ROOT, env=env, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(control.state()["meter_events"]) < 40:
            time.sleep(0.05)
        assert len(control.state()["meter_events"]) >= 40, "the pusher never got going"
    finally:
        os.killpg(pusher.pid, signal.SIGKILL)  # mid-push: claimed rows, calls in flight
        pusher.wait(timeout=10)
    sent_before = len(control.state()["meter_events"])
    with raw_transaction(engine) as conn:
        (pending,) = conn.execute(
            "SELECT count(*) FROM stripe_outbox WHERE status = 'pending'"
        ).fetchone()
    assert pending > 0 and sent_before < 300
    control.clear_faults()
    time.sleep(2.1)  # the dead pusher's claims expire
    push_all(engine, stripe_settings)
    identifiers = Counter(e["identifier"] for e in control.state()["meter_events"])
    assert max(identifiers.values()) == 1
    assert stripe_totals(control) == ledger_billed_by_stripe_customer(db)
