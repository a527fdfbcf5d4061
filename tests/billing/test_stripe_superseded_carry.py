"""Issue #20 gap 4: a superseded row gives back the carry its unsent steps took.

Meter values are whole units; what is left under a unit is carried per customer and period,
so that Σ units × unit + carry = Σ micros over what Stripe received. A planned row that
settlement supersedes before it is sent never sends its steps: the remainder they carried
must be returned, or every such correction leaves up to a unit too much in the carry.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from metering.billing.push import Pusher
from tests.billing.harness import (
    UNIT_MICROS,
    big_run,
    credit,
    drain,
    events_of,
    invoicing_settings,
    run_id_of,
)


def _carry_from_deliveries(db: Any, customer: str) -> int:
    """What the meter carry must be: Σ micros − Σ units × unit over what took effect."""
    (expected,) = db.execute(
        """
        SELECT COALESCE(sum(CASE WHEN kind = 'meter_event' THEN micros - units * %(unit)s
                                 ELSE micros + units * %(unit)s END), 0)
        FROM stripe_deliveries
        WHERE customer_id = %(customer)s
          AND kind IN ('meter_event', 'meter_cancel', 'meter_rejected')
        """,
        {"unit": UNIT_MICROS, "customer": customer},
    ).fetchone()
    return int(expected)


def test_superseding_a_planned_unsent_row_gives_its_carry_back(
    engine, stripe_settings, db, control, link
):
    settings = invoicing_settings(stripe_settings)
    big_run(engine, settings, "run-c", "cust-c")  # 1,200,000 micros: 120 units
    link("cust-c")
    pusher = Pusher(engine, settings)
    drain(pusher, engine)

    # Half a unit off: version 2 is planned (cancel, resend 119 units, 5,000 carried) but
    # Stripe is down, so none of it is sent.
    control.inject_faults(rate=1.0, kinds=["500"], path="/v1/billing/meter_event_adjustments")
    credit(engine, settings, "run-c", 5_000, datetime.now(UTC))
    pusher.push_due()
    (planned,) = db.execute(
        "SELECT next_step FROM stripe_outbox WHERE decision_version = 2 AND plan IS NOT NULL"
    ).fetchone()
    assert planned == 0

    # Another half unit: version 3 supersedes version 2 before it was ever sent.
    credit(engine, settings, "run-c", 5_000, datetime.now(UTC))
    control.clear_faults()
    drain(pusher, engine)

    statuses = db.execute(
        "SELECT decision_version, status FROM stripe_outbox ORDER BY decision_version"
    ).fetchall()
    assert statuses == [(1, "sent"), (2, "superseded"), (3, "sent")]
    (carry,) = db.execute(
        "SELECT carry_micros FROM stripe_carries WHERE customer_id = 'cust-c'"
    ).fetchone()
    assert carry == _carry_from_deliveries(db, "cust-c") == 0  # 1,190,000 = 119 units exactly
    live = {
        ident: e["value"]
        for ident, e in events_of(control, run_id_of(db, "run-c")).items()
        if not e["cancelled"]
    }
    assert sum(int(v) for v in live.values()) * UNIT_MICROS == 1_190_000
