"""Every correction path end to end, with the emulator's clock moved across 24 h."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from metering.billing.push import Pusher
from tests.billing.harness import (
    big_run,
    credit,
    drain,
    events_of,
    late_usage,
    push_all,
    run_id_of,
)


def customer_balance(control: Any, stripe_id: str) -> int:
    (found,) = [c for c in control.state()["customers"] if c["id"] == stripe_id]
    return int(found["balance"])


def test_cancel_and_resend_then_increase_then_cancel_and_resend_of_the_fresh_part(
    engine, stripe_settings, db, control, link
):
    big_run(engine, stripe_settings, "run-c", "cust-c")
    stripe_id = link("cust-c")
    rid = run_id_of(db, "run-c")
    push_all(engine, stripe_settings)
    assert {k: e["value"] for k, e in events_of(control, rid).items()} == {
        f"run:{rid}:v1": 1_200_000
    }

    # Within 24 h of Stripe receiving it: cancel v1, send v2.
    credit(engine, stripe_settings, "run-c", 200_000, datetime.now(UTC))
    push_all(engine, stripe_settings)
    sent = events_of(control, rid)
    assert sent[f"run:{rid}:v1"]["cancelled"] is True
    assert sent[f"run:{rid}:v2"]["value"] == 1_000_000 and not sent[f"run:{rid}:v2"]["cancelled"]

    # 25 hours later (Stripe's clock and ours): an increase is an extra event for the difference.
    control.advance_clock(25 * 3600)
    later = datetime.now(UTC) + timedelta(hours=25)
    pusher = Pusher(engine, stripe_settings, clock=lambda: datetime.now(UTC) + timedelta(hours=25))
    late_usage(engine, stripe_settings, "run-c", "cust-c")
    drain(pusher, engine)
    sent = events_of(control, rid)
    assert sent[f"run:{rid}:v3"]["value"] == 300_000 and not sent[f"run:{rid}:v2"]["cancelled"]

    # A decrease: v2 is older than 24 h, v3 is not and its period is open, so v3 is
    # cancelled and the rest resent; no customer balance credit (issue #20).
    credit(engine, stripe_settings, "run-c", 123_456, later)
    drain(pusher, engine)
    assert customer_balance(control, stripe_id) == 0
    sent = events_of(control, rid)
    assert sent[f"run:{rid}:v3"]["cancelled"] is True
    assert sent[f"run:{rid}:v4"]["value"] == 176_544
    live = sum(e["value"] for e in sent.values() if not e["cancelled"])
    billed = db.execute("SELECT billed_micros FROM runs WHERE id = %s", (rid,)).fetchone()[0]
    assert live == billed == 1_176_544
    history = db.execute(
        "SELECT kind, micros FROM stripe_deliveries WHERE run_id = %s ORDER BY id", (rid,)
    ).fetchall()
    assert [k for k, _ in history] == [
        "meter_event",
        "meter_cancel",
        "meter_event",
        "meter_event",
        "meter_cancel",
        "meter_event",
    ]


def test_negative_meter_event_while_the_invoice_is_open(engine, stripe_settings, db, control, link):
    negative = stripe_settings.model_copy(update={"stripe_allow_negative_meter_values": True})
    control.settings(allow_negative_values=True)
    big_run(engine, negative, "run-n", "cust-n")
    link("cust-n")
    rid = run_id_of(db, "run-n")
    push_all(engine, negative)
    control.advance_clock(25 * 3600)
    clock = lambda: datetime.now(UTC) + timedelta(hours=25)  # noqa: E731
    credit(engine, negative, "run-n", 100_000, clock())
    push_all(engine, negative, clock)
    assert events_of(control, rid)[f"run:{rid}:v2"]["value"] == -100_000

    # Credits after the period's invoice is finalized are credit notes on that invoice:
    # tests/billing/test_stripe_invoiced_corrections.py.
