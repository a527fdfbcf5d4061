"""Issue #20 gap 6: the ``no_meter`` outcome of an error report, end to end.

Stripe takes a meter event for an event name no meter has (200), then reports it in a thin
``v1.billing.meter.no_meter_found`` event. The documented outcome (docs/stripe.md, "Error
reports"): the event counts as having no effect and its row is dead-lettered with the code;
once the meter exists again, retrying the dead rows resends the usage, which then bills.
Here the Stripe account loses the meter after the pusher set it up (a sandbox reset: the
pusher's key now reaches an account with no meter for the event name).
"""

from __future__ import annotations

from metering.billing import outbox
from metering.billing.push import Pusher
from metering.billing.service import handle_webhooks
from metering.db import raw_transaction
from tests.billing.harness import (
    UNIT_MICROS,
    big_run,
    create_meter,
    drain,
    invoicing_settings,
    subscribe_destinations,
)


def test_no_meter_report_dead_letters_the_row_and_a_retry_after_the_meter_exists_bills_it(
    engine, stripe_settings, db, control, link, sdk, webhook_api
):
    settings = invoicing_settings(stripe_settings)
    pusher = Pusher(engine, settings)
    pusher.push_due()  # sets up the meter, once per pusher
    control.reset()  # the account no longer has it
    control.settings(validation_mode="async")
    subscribe_destinations(control, webhook_api)
    big_run(engine, settings, "run-m", "cust-m")  # 120 units
    stripe_id = link("cust-m")
    drain(pusher, engine)
    assert [e["error_code"] for e in control.state()["meter_events"]] == ["no_meter"]

    control.issue_error_reports()
    handle_webhooks(engine, settings)
    (kind,) = db.execute("SELECT type FROM stripe_webhook_inbox").fetchone()
    assert kind == "v1.billing.meter.no_meter_found"
    (status, error) = db.execute("SELECT status, last_error FROM stripe_outbox").fetchone()
    assert status == "dead" and ": no_meter (report " in error
    effect = db.execute(
        "SELECT sum(micros) FROM stripe_deliveries WHERE kind IN ('meter_event', 'meter_rejected')"
    ).fetchone()
    assert effect == (0,)  # the rejected event never reached Stripe's totals

    create_meter(sdk, settings.stripe_meter_event_name, "Fairmeter billed usage")  # the fix
    with raw_transaction(engine) as conn:
        assert outbox.retry_dead(conn, None, [], settings.stripe_meter_unit_micros) == 1
    drain(pusher, engine)
    live = [e for e in control.state()["meter_events"] if e["error_code"] is None]
    assert [(e["customer"], int(e["value"])) for e in live] == [(stripe_id, 120)]
    (status,) = db.execute("SELECT status FROM stripe_outbox").fetchone()
    assert status == "sent"
    (sent,) = db.execute(
        "SELECT sum(units) FROM stripe_deliveries WHERE kind = 'meter_event' "
        "AND NOT EXISTS (SELECT 1 FROM stripe_deliveries r WHERE r.kind = 'meter_rejected' "
        "AND r.cancels_identifier = stripe_deliveries.identifier)"
    ).fetchone()
    assert sent * UNIT_MICROS == 1_200_000
