"""Issue #20 gap 3: snapshot events rendered in another API version than the pinned one.

Stripe renders a snapshot event's object in its endpoint's API version, which need not be
``stripe_api_version`` (an endpoint left on the account's old default, or two endpoints
during an upgrade). Fairmeter does not parse a shape it did not pin: it logs the event and
reads the invoice from the API in its own version, then tracks it as usual.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from metering.billing.service import handle_webhooks
from tests.billing.harness import SNAPSHOT_SECRET, Clocks, invoicing_settings, month_end

OLD_VERSION = "2024-06-20"


def _finalized_invoice(control, sdk, clocks: Clocks) -> tuple[str, str, str]:
    """A customer whose month's invoice Stripe has finalized: (customer, invoice, status);
    a zero invoice is paid at once."""
    customer = str(sdk.v1.customers.create(params={"name": "versions"}).id)
    control.subscribe(customer)
    clocks.jump(month_end(datetime.now(UTC)) + timedelta(hours=1, minutes=1))
    control.run_invoicing()
    (invoice,) = sdk.v1.invoices.list(params={"customer": customer}).data
    assert invoice.status in ("open", "paid")
    return customer, str(invoice.id), str(invoice.status)


def test_a_snapshot_in_another_api_version_is_logged_and_its_invoice_read_in_ours(
    engine, stripe_settings, db, control, sdk, webhook_api, caplog
):
    settings = invoicing_settings(stripe_settings)
    clocks = Clocks(control)
    customer, invoice_id, status = _finalized_invoice(control, sdk, clocks)
    # What an endpoint on an old version may send: nothing we can rely on but the id.
    control.deliver_webhook(
        url=f"{webhook_api}/webhooks/stripe",
        secret=SNAPSHOT_SECRET,
        event={
            "id": "evt_old_version",
            "object": "event",
            "api_version": OLD_VERSION,
            "created": int(clocks.now().timestamp()),
            "type": "invoice.finalized",
            "data": {"object": {"id": invoice_id, "object": "invoice"}},
        },
    )
    with caplog.at_level(logging.WARNING, logger="fairmeter.stripe"):
        assert handle_webhooks(engine, settings) == 1

    tracked = db.execute(
        "SELECT stripe_customer_id, status FROM stripe_invoices WHERE invoice_id = %s",
        (invoice_id,),
    ).fetchall()
    assert tracked == [(customer, status)]
    closed = db.execute(
        "SELECT count(*) FROM stripe_closed_periods WHERE invoice_id = %s", (invoice_id,)
    ).fetchone()
    assert closed == (1,)
    warned = [r for r in caplog.records if "another API version" in r.getMessage()]
    assert [getattr(r, "api_version", None) for r in warned] == [OLD_VERSION]


def test_an_endpoint_on_an_older_api_version_still_closes_the_period(
    engine, stripe_settings, db, control, sdk, webhook_api
):
    settings = invoicing_settings(stripe_settings)
    control.add_destination(
        url=f"{webhook_api}/webhooks/stripe",
        secret=SNAPSHOT_SECRET,
        style="snapshot",
        api_version="2025-03-31.basil",
    )
    clocks = Clocks(control)
    _, invoice_id, status = _finalized_invoice(control, sdk, clocks)
    handle_webhooks(engine, settings)

    versions = db.execute(
        "SELECT DISTINCT payload->>'api_version' FROM stripe_webhook_inbox "
        "WHERE type LIKE 'invoice.%%'"
    ).fetchall()
    assert versions == [("2025-03-31.basil",)]
    tracked = db.execute(
        "SELECT status FROM stripe_invoices WHERE invoice_id = %s", (invoice_id,)
    ).fetchone()
    assert tracked == (status,)
