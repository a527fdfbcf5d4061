"""Webhooks: verified, stored once, handled once. Drift: a planted difference is reported."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta

import httpx

from devtools.stripe_emulator.webhooks import signature_header
from metering.billing.service import drift, handle_webhooks
from tests.billing.harness import SNAPSHOT_SECRET, THIN_SECRET, push_all, settled_runs


def invoice_event(customer: str = "cus_x") -> dict:
    return {
        "id": "evt_manual_1",
        "object": "event",
        "type": "invoice.finalized",
        "data": {
            "object": {
                "id": "in_1",
                "object": "invoice",
                "customer": customer,
                "period_start": 1_790_000_000,
                "period_end": 1_792_000_000,
            }
        },
    }


def post_signed(base: str, payload: str, header: str) -> httpx.Response:
    return httpx.post(
        f"{base}/webhooks/stripe",
        content=payload,
        timeout=10,
        headers={"content-type": "application/json", "stripe-signature": header},
    )


def test_valid_webhook_delivered_five_times_is_stored_and_handled_once(
    webhook_api, control, engine, stripe_settings, db
):
    outcome = control.deliver_webhook(
        url=f"{webhook_api}/webhooks/stripe",
        secret=SNAPSHOT_SECRET,
        type="invoice.finalized",
        customer="cus_abc",
        period_start=1_790_000_000,
        period_end=1_792_000_000,
        times=5,
    )
    assert [d["status"] for d in outcome["deliveries"]] == [200] * 5
    bodies = [json.loads(d["body"]) for d in outcome["deliveries"]]
    assert [b["duplicate"] for b in bodies] == [False, True, True, True, True]
    assert db.execute("SELECT count(*) FROM stripe_webhook_inbox").fetchone() == (1,)
    assert handle_webhooks(engine, stripe_settings) == 1
    assert handle_webhooks(engine, stripe_settings) == 0
    assert db.execute("SELECT count(*) FROM stripe_closed_periods").fetchone() == (1,)


def test_tampered_wrong_secret_and_stale_webhooks_are_400_and_not_stored(webhook_api, db):
    payload = json.dumps(invoice_event())
    now = int(time.time())
    tampered = post_signed(
        webhook_api,
        payload.replace("cus_x", "cus_y"),
        signature_header(payload, SNAPSHOT_SECRET, now),
    )
    wrong_secret = post_signed(webhook_api, payload, signature_header(payload, "whsec_other", now))
    stale = post_signed(webhook_api, payload, signature_header(payload, SNAPSHOT_SECRET, now - 301))
    unsigned = httpx.post(f"{webhook_api}/webhooks/stripe", content=payload, timeout=10)
    for reply in (tampered, wrong_secret, stale, unsigned):
        assert reply.status_code == 400, reply.text
        assert reply.headers["content-type"].startswith("application/problem+json")
    assert db.execute("SELECT count(*) FROM stripe_webhook_inbox").fetchone() == (0,)
    fresh = post_signed(webhook_api, payload, signature_header(payload, SNAPSHOT_SECRET, now))
    assert fresh.status_code == 200


def test_meter_error_report_thin_event_dead_letters_the_named_rows(
    webhook_api, control, engine, stripe_settings, db, link
):
    """The report comes from the thin-event destination, with its own secret."""
    settled_runs(engine, stripe_settings, runs=3, customers=1, kinds=("completed",))
    db.execute("UPDATE customers SET stripe_customer_id = 'cus_unknown_to_stripe'")
    db.execute("UPDATE stripe_outbox SET status = 'pending' WHERE status = 'waiting_customer'")
    push_all(engine, stripe_settings)  # accepted, then flagged by Stripe
    outcome = control.deliver_webhook(
        url=f"{webhook_api}/webhooks/stripe/thin",
        secret=THIN_SECRET,
        type="v1.billing.meter.error_report_triggered",
    )
    assert [d["status"] for d in outcome["deliveries"]] == [200], outcome["deliveries"]
    assert handle_webhooks(engine, stripe_settings) == 1  # fetched the thin event's data
    dead = db.execute("SELECT count(*) FROM stripe_outbox WHERE status = 'dead'").fetchone()[0]
    assert dead == 3


def test_drift_check_reports_a_planted_difference_and_nothing_when_totals_agree(
    engine, stripe_settings, db, link, sdk, control
):
    settled_runs(engine, stripe_settings, runs=30, customers=1)
    stripe_id = link("cust-0")
    push_all(engine, stripe_settings)
    lag_s = control.state()["settings"]["summary_lag_s"]
    control.advance_clock(lag_s + 1)  # Stripe's summaries show what it received by now
    start = datetime.now(UTC) - timedelta(days=1)
    end = datetime.now(UTC) + timedelta(hours=1)
    assert drift(engine, stripe_settings, "acme", "cust-0", start, end) == []
    planted_at = datetime.now(UTC) - timedelta(hours=5)
    sdk.v1.billing.meter_events.create(
        params={
            "event_name": stripe_settings.stripe_meter_event_name,
            "identifier": "planted-1",
            "payload": {"stripe_customer_id": stripe_id, "value": "777"},
            "timestamp": int(planted_at.timestamp()),
        }
    )
    control.advance_clock(lag_s + 1)
    (difference,) = drift(engine, stripe_settings, "acme", "cust-0", start, end)
    assert difference.hour == planted_at.replace(minute=0, second=0, microsecond=0)
    assert (difference.ledger_units, difference.stripe_units, difference.delta) == (0, 777, 777)
