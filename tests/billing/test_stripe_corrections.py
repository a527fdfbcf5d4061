"""Every correction path end to end, with the emulator's clock moved across 24 h."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from metering.billing.push import Pusher
from metering.db import raw_transaction
from metering.disputes.service import Credit, grant_credit
from metering.keys import Principal, Scope
from metering.runs import find_run_id
from metering.settlement.runner import settle_due_now
from tests.billing.harness import drain
from tests.helpers.events import event, usage
from tests.helpers.ingest import ingest

START = datetime.now(UTC) - timedelta(hours=2)
ADMIN = Principal(tenant_id="acme", scope=Scope.ADMIN, key_id="test-admin")


def big_run(engine: Any, settings: Any, run: str, customer: str) -> None:
    """Two steps of 600,000 micros each (agent-large-1), completed: bills 1,200,000."""
    ingest(
        engine,
        settings,
        [
            usage(
                run=run,
                customer=customer,
                step=s,
                input_tokens=100_000,
                output_tokens=20_000,
                time=START + timedelta(minutes=s),
            )
            for s in (1, 2)
        ]
        + [
            event(
                run=run, customer=customer, type="run.completed", time=START + timedelta(minutes=3)
            )
        ],
    )
    settle_due_now(engine, settings, now=datetime.now(UTC))


def credit(engine: Any, settings: Any, run: str, micros: int, now: datetime) -> None:
    with raw_transaction(engine) as conn:
        grant_credit(
            conn,
            ADMIN,
            find_run_id(conn, ADMIN, run),
            Credit(amount_micros=micros),
            reason="correction test",
            settings=settings,
            now=now,
            action="run.credit",
        )


def events_of(control: Any, run_id: int) -> dict[str, dict[str, Any]]:
    return {
        e["identifier"]: e
        for e in control.state()["meter_events"]
        if e["identifier"].startswith(f"run:{run_id}:")
    }


def customer_balance(control: Any, stripe_id: str) -> int:
    (found,) = [c for c in control.state()["customers"] if c["id"] == stripe_id]
    return int(found["balance"])


def run_id_of(db: Any, run: str) -> int:
    return int(db.execute("SELECT id FROM runs WHERE subject = %s", (run,)).fetchone()[0])


def test_cancel_and_resend_then_increase_then_cancel_and_resend_of_the_fresh_part(
    engine, stripe_settings, db, control, link
):
    big_run(engine, stripe_settings, "run-c", "cust-c")
    stripe_id = link("cust-c")
    rid = run_id_of(db, "run-c")
    drain(Pusher(engine, stripe_settings), engine)
    assert {k: e["value"] for k, e in events_of(control, rid).items()} == {
        f"run:{rid}:v1": 1_200_000
    }

    # Within 24 h of Stripe receiving it: cancel v1, send v2.
    credit(engine, stripe_settings, "run-c", 200_000, datetime.now(UTC))
    drain(Pusher(engine, stripe_settings), engine)
    sent = events_of(control, rid)
    assert sent[f"run:{rid}:v1"]["cancelled"] is True
    assert sent[f"run:{rid}:v2"]["value"] == 1_000_000 and not sent[f"run:{rid}:v2"]["cancelled"]

    # 25 hours later (Stripe's clock and ours): an increase is an extra event for the difference.
    control.advance_clock(25 * 3600)
    later = datetime.now(UTC) + timedelta(hours=25)
    pusher = Pusher(engine, stripe_settings, clock=lambda: datetime.now(UTC) + timedelta(hours=25))
    ingest(
        engine,
        stripe_settings,
        [
            usage(
                run="run-c",
                customer="cust-c",
                step=3,
                input_tokens=50_000,
                output_tokens=10_000,
                time=START + timedelta(minutes=2.5),
            )
        ],
    )
    settle_due_now(engine, stripe_settings, now=datetime.now(UTC))
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
    drain(Pusher(engine, negative), engine)
    control.advance_clock(25 * 3600)
    clock = lambda: datetime.now(UTC) + timedelta(hours=25)  # noqa: E731
    credit(engine, negative, "run-n", 100_000, clock())
    drain(Pusher(engine, negative, clock=clock), engine)
    assert events_of(control, rid)[f"run:{rid}:v2"]["value"] == -100_000

    # Credits after the period's invoice is finalized are credit notes on that invoice:
    # tests/billing/test_stripe_invoiced_corrections.py.
