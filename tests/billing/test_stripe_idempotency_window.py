"""Issues #20 and #29: Stripe's idempotency window, with summaries that lag. A 5xx stored
under a key is replayed on every retry: the pusher probes with the same identifier under a
fresh key, so Stripe itself says whether the first attempt landed. Past the identifier
window nothing is sent, and a summary that has not moved is never read as "not landed"
before ``stripe_summary_trust_s``. The emulator's summaries lag 10 minutes throughout and
the invoice ends equal to the ledger.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import Any

import pytest
from litestar.testing import TestClient

from api.app import create_app
from tests.billing.harness import (
    START,
    Clocks,
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
LAGGING = {"summary_lag_s": 600}  # Stripe's summaries show an event 10 minutes late


def identifiers(control: Any) -> list[str]:
    return sorted(e["identifier"] for e in control.state()["meter_events"] if not e["cancelled"])


def pending(db: Any) -> int:
    return int(
        db.execute("SELECT count(*) FROM stripe_outbox WHERE status = 'pending'").fetchone()[0]
    )


def push_as_minutes_pass(pusher: Any, db: Any, clocks: Clocks, minutes: int = 20) -> None:
    """Push, both clocks moving a minute between rounds (past the summaries' lag), until the
    outbox is empty."""
    for _ in range(minutes):
        pusher.push_due()
        if pending(db) == 0:
            return
        clocks.jump(clocks.now() + timedelta(minutes=1))
    raise AssertionError(f"rows still pending after {minutes} minutes")


@pytest.mark.parametrize(
    ("fault", "make_run", "units"),
    [
        # Stripe does nothing but stores a 500 under the key: every retry with it replays it.
        ("stored_500", small_run, 60),
        # Stripe commits the event, then stores a 500 under the key; the summary shows the
        # event only 10 minutes later.
        ("stored_500_after_commit", big_run, 120),
    ],
    ids=["not-landed", "landed"],
)
def test_replayed_500_is_probed_under_its_identifier_and_billed_once(
    fault, make_run, units, engine, stripe_settings, db, control, link, sdk
):
    invoicing = start_invoicing(stripe_settings, control, emulator=LAGGING)
    billing, clocks = invoicing.settings, invoicing.clocks
    make_run(engine, billing, "run-1", "cust-d")
    stripe_id = link("cust-d")
    control.inject_faults(next=[fault], path=METER_EVENTS)
    push_as_minutes_pass(invoicing.pusher(engine), db, clocks)

    finalize_month_of(START, clocks, engine, billing)
    assert invoiced_minor(sdk, stripe_id) == billed_minor(db, "cust-d")
    assert billed_minor(db, "cust-d") == {START.strftime("%Y-%m"): units}
    # The probe (same identifier, fresh key) was refused as a duplicate or taken: no resend
    # under a new identifier.
    assert identifiers(control) == [f"run:{run_id_of(db, 'run-1')}:v1"]


def test_past_the_window_nothing_is_resent_until_summaries_are_trusted_and_rows_alarm(
    engine, stripe_settings, db, control, link, sdk, caplog
):
    trust = timedelta(hours=1)  # the default is 6 h; an hour keeps the test in one month
    invoicing = start_invoicing(
        stripe_settings, control, emulator=LAGGING, stripe_summary_trust_s=trust.total_seconds()
    )
    billing, clocks = invoicing.settings, invoicing.clocks
    pusher = invoicing.pusher(engine)
    big_run(engine, billing, "run-landed", "cust-e")
    small_run(engine, billing, "run-lost", "cust-e")
    stripe_id = link("cust-e")
    first = clocks.now()
    control.inject_faults(next=["500", "500", "500"], path=METER_EVENTS)  # Stripe is down
    pusher.push_due()
    # Near the window's end the first row's event lands, its reply is lost, Stripe fails again.
    clocks.jump(first + timedelta(hours=22, minutes=55))
    control.inject_faults(next=["drop_after_commit", "500", "500"], path=METER_EVENTS)
    pusher.push_due()

    # Past the sending window the summary has not moved yet (it lags 10 minutes): rounds
    # go by, the rows wait.
    clocks.jump(first + timedelta(hours=23, minutes=1))
    with caplog.at_level(logging.ERROR, logger="fairmeter.stripe"):
        for _ in range(3):
            pusher.push_due()
            time.sleep(0.1)  # past the test's backoff
    landed, lost = run_id_of(db, "run-landed"), run_id_of(db, "run-lost")
    assert identifiers(control) == [f"run:{landed}:v1"]  # nothing resent
    assert pending(db) == 2
    with TestClient(app=create_app(billing)) as client:
        metrics = client.get("/metrics").text
    assert "fairmeter_stripe_outbox_awaiting_reconciliation 1.0" in metrics
    alarms = [r for r in caplog.records if r.getMessage() == "stripe row awaiting reconciliation"]
    assert alarms and alarms[0].levelno == logging.ERROR
    assert {"outbox_id", "customer", "hour"} <= set(vars(alarms[0]))
    assert alarms[0].customer == "cust-e"

    # Once trusted, the summary says the first row landed (recorded) and the second did not
    # (resent under a new identifier).
    clocks.jump(first + timedelta(hours=23, minutes=1) + trust)
    drain(pusher, engine)
    assert identifiers(control) == sorted([f"run:{landed}:v1", f"run:{lost}:v1:g1"])
    finalize_month_of(START, clocks, engine, billing)
    assert invoiced_minor(sdk, stripe_id) == billed_minor(db, "cust-e")
    assert billed_minor(db, "cust-e") == {START.strftime("%Y-%m"): 180}
