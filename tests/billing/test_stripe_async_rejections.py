"""Issue #20: Stripe accepts meter events with 200 and rejects them later, in an error report.

The report samples at most five events per code; the rest are found by comparing what was
sent in the report's window with Stripe's summaries. Every rejected event counts as having
no effect, its row is dead-lettered with the code, and ``fairmeter stripe dead --retry-all``
plans the rows again from what Stripe actually has: the invoice ends equal to the ledger.
"""

from __future__ import annotations

import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

from litestar.testing import TestClient

from api.app import create_app
from metering.billing.service import handle_webhooks
from metering.config import Settings
from metering.db import raw_transaction
from metering.disputes.timeline import timeline
from metering.keys import Principal, Scope
from tests.billing.harness import (
    START,
    away_from_a_month_end,
    big_run,
    billed_minor,
    drain,
    finalize_month_of,
    invoiced_minor,
    link_unknown_to_stripe,
    run_id_of,
    start_invoicing,
)
from tests.helpers import ROOT
from tests.helpers.processes import service_env

pytestmark = away_from_a_month_end()
RUNS = 8  # more than the report's five samples


def assert_the_rejection_is_shown_where_people_look(
    engine: Any, settings: Settings, run: str, count: int
) -> None:
    """Issue #15 item 5: a second `make up` once met a database keeping Stripe customer ids
    a fresh emulator did not know; every meter event came back
    ``meter_event_customer_not_found`` while the console said "sent". The console's Stripe
    row and the metric now say what Stripe did."""
    support = Principal("acme", Scope.SUPPORT, "test")
    with raw_transaction(engine) as conn:
        (row,) = timeline(conn, support, run).stripe
    assert (row.status, row.label) == ("dead", "rejected by Stripe")
    assert "meter_event_customer_not_found" in (row.last_error or "")
    with TestClient(app=create_app(settings)) as client:
        metrics = client.get("/metrics").text
    found = re.findall(r'fairmeter_stripe_meter_events_rejected\{code="([^"]+)"\} (\S+)', metrics)
    assert sum(float(n) for _, n in found) == count
    assert {code for code, _ in found} <= {
        "meter_event_customer_not_found",
        "unsampled:meter_event_customer_not_found",
    }


def test_async_rejection_is_found_beyond_the_samples_retried_and_invoiced_once(
    engine, settings, stripe_settings, db, control, link, sdk, webhook_api
):
    invoicing = start_invoicing(
        stripe_settings,
        control,
        webhook_api,
        emulator={"validation_mode": "async"},
        # Every event of this customer is rejected, so a lagging summary has nothing to hide;
        # waiting out the trust window is test_stripe_lagging_rejections.py's subject.
        stripe_summary_trust_s=0.0,
    )
    billing = invoicing.settings
    for number in range(RUNS):
        big_run(engine, billing, f"run-{number}", "cust-0")  # 120 units each
    link_unknown_to_stripe(engine, "cust-0")
    pusher = invoicing.pusher(engine)
    drain(pusher, engine)
    assert db.execute("SELECT count(*) FROM stripe_outbox WHERE status = 'sent'").fetchone() == (
        RUNS,
    )

    report = control.issue_error_reports()["reports"]
    assert len(report) == 1
    handle_webhooks(engine, billing)  # fetched in full, compared with the summaries
    dead = db.execute("SELECT last_error FROM stripe_outbox WHERE status = 'dead'").fetchall()
    assert len(dead) == RUNS
    rejected = db.execute(
        "SELECT count(*) FROM stripe_deliveries WHERE kind = 'meter_rejected'"
    ).fetchone()
    assert rejected == (RUNS,)
    assert_the_rejection_is_shown_where_people_look(engine, settings, "run-0", RUNS)

    stripe_id = link("cust-0")
    retried = subprocess.run(
        [sys.executable, "-m", "cli", "stripe", "dead", "--retry-all"],
        cwd=ROOT,
        env=service_env(settings),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert f"{RUNS} row(s) back to pending" in retried.stdout
    drain(pusher, engine)
    finalize_month_of(START, invoicing.clocks, engine, billing)

    assert invoiced_minor(sdk, stripe_id) == billed_minor(db, "cust-0")
    assert billed_minor(db, "cust-0") == {START.strftime("%Y-%m"): RUNS * 120}


def test_a_timestamp_rejected_as_too_old_is_planned_again_at_once_and_dated_now(
    engine, stripe_settings, db, control, link, sdk, webhook_api
):
    """Our clock ran 40 days behind Stripe's: Stripe takes the event, then rejects it as
    older than its 35 days. That code needs no operator: the row is planned again at once,
    and the resend is dated now, in the open month, never back into a finalized one."""
    invoicing = start_invoicing(
        stripe_settings, control, webhook_api, emulator={"validation_mode": "async"}
    )
    billing, clocks = invoicing.settings, invoicing.clocks
    big_run(engine, billing, "run-old", "cust-f")
    stripe_id = link("cust-f")
    later = datetime.now(UTC) + timedelta(days=40)
    control.set_clock(int(later.timestamp()), frozen=True)  # Stripe's clock only
    pusher = invoicing.pusher(engine)
    drain(pusher, engine)
    control.issue_error_reports()
    handle_webhooks(engine, billing)
    (status, plan) = db.execute("SELECT status, plan FROM stripe_outbox").fetchone()
    assert (status, plan) == ("pending", None)

    clocks.jump(later)  # our clock catches up
    drain(pusher, engine)
    events = {e["identifier"]: e for e in control.state()["meter_events"]}
    run_id = run_id_of(db, "run-old")
    assert events[f"run:{run_id}:v1"]["error_code"] == "timestamp_too_far_in_past"
    resent = events[f"run:{run_id}:v1:g1"]
    assert resent["error_code"] is None and resent["timestamp"] >= int(later.timestamp()) - 5
    finalize_month_of(later, clocks, engine, billing)
    invoiced = invoiced_minor(sdk, stripe_id)
    assert invoiced == {later.strftime("%Y-%m"): 120}
    assert sum(invoiced.values()) == sum(billed_minor(db, "cust-f").values())
