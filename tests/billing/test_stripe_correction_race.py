"""Issue #29 item 2: a correction settled while a pusher is still sending the old version.

Superseding the old row cleared its claim, and a claim counted only pending rows as busy, so a
second pusher planned the new version without the call still in flight: it sent the whole new
amount on top of the old event it never saw (120 + 60 units invoiced, 60 in the ledger). One
pusher holds a customer now, from planning until the call's result is recorded, so the
correction is planned against what is in flight: the old event cancelled, the new one sent.

The second pusher is the real Celery worker's ``fairmeter.push_stripe_outbox`` (the task
beat and every settlement chunk send), in its own process, on the emulator over HTTP.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from devtools.stripe_emulator import EmulatorServer
from tests.billing.harness import (
    START,
    UNIT_MICROS,
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
from tests.helpers.celery_worker import start_celery, stop_celery, worker_env

pytestmark = away_from_a_month_end()
SLOW_S = 8.0  # how long Stripe holds the old version's meter event: the window of the race
PUSHED = re.compile(r"fairmeter\.push_stripe_outbox\[[^\]]+\] succeeded in [^:]+: (\d+)")


@pytest.fixture
def worker(settings: Any, emulator: EmulatorServer, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A real worker (no beat: the test sends the push) on the emulator, as the test's
    pushers are set up: one meter unit = one cent, short leases, retries ours."""
    env = worker_env(
        settings,
        FAIRMETER_STRIPE_API_BASE=emulator.url,
        FAIRMETER_STRIPE_METER_UNIT_MICROS=str(UNIT_MICROS),
        FAIRMETER_STRIPE_SUMMARY_LAG_S="0",
        FAIRMETER_STRIPE_MAX_NETWORK_RETRIES="0",
        FAIRMETER_STRIPE_TIMEOUT_S="60",
        FAIRMETER_STRIPE_PUSH_LEASE_S="2",
        FAIRMETER_LOG_LEVEL="INFO",
    )
    log = tmp_path / "worker.log"
    proc = start_celery(["worker", "--concurrency", "2", "--loglevel", "INFO"], env, log)
    try:
        wait_for(lambda: "ready." in log.read_text(errors="replace"), deadline_s=120)
        yield {"env": env, "log": log}
    finally:
        stop_celery(proc)


def _pushed_by_worker(worker: dict[str, Any]) -> int:
    """Send the worker one push and wait for it: the rows it sent."""
    app = Celery(broker=worker["env"]["REDIS_URL"])
    before = len(PUSHED.findall(worker["log"].read_text(errors="replace")))
    app.send_task("fairmeter.push_stripe_outbox")
    wait_for(lambda: len(PUSHED.findall(worker["log"].read_text(errors="replace"))) > before)
    return int(PUSHED.findall(worker["log"].read_text(errors="replace"))[-1])


def test_a_correction_settled_while_the_old_version_is_in_flight_bills_the_corrected_amount(
    engine, stripe_settings, db, control, link, sdk, webhook_api, worker
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
    pusher = invoicing.pusher(engine)

    with ThreadPoolExecutor(max_workers=1) as pool:
        sending = pool.submit(pusher.push_due)
        # Stripe has the 120 units; the pusher has not had its reply yet.
        wait_for(lambda: len(control.state()["meter_events"]) == 1)
        credit(engine, settings, "run-x", 600_000, datetime.now(UTC))  # version 2: 60 units
        racing_rows = _pushed_by_worker(worker)
        assert not sending.done(), f"the race window closed early (slow_s={SLOW_S})"
        sent = sending.result(timeout=120)

    drain(pusher, engine)
    finalize_month_of(START, clocks, engine, settings)

    month = START.strftime("%Y-%m")
    assert invoiced_minor(sdk, stripe_id) == billed_minor(db, "cust-x") == {month: 60}
    (invoice,) = sdk.v1.invoices.list(params={"customer": stripe_id}).data
    assert (invoice.currency, invoice.total) == ("eur", 60)  # €0.60, as the statement says
    # The customer was the first pusher's until it had recorded its call.
    assert (sent.calls, racing_rows) == (1, 0)
