"""One tenant's hanging receiver does not hold up another tenant's webhooks: a delivery round
sends at most ``webhooks_endpoint_concurrency`` at once to any endpoint, and a claim takes at
most eight times that per endpoint, so the other endpoints keep their send slots (issue #16;
isolation: nothing one tenant does changes what another gets)."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

from metering.webhooks.delivery import deliver_due
from metering.webhooks.fanout import fan_out_pending
from reconciler.webhook_sender import WebhookSender
from tests.helpers.webhooks import Receiver, add_endpoint, notify, wait_for

TIMEOUT_S = 6.0  # the margin a loaded host needs: the healthy send must beat half of it


def now() -> datetime:
    return datetime.now(UTC)


def test_a_hanging_receiver_of_one_tenant_does_not_delay_another_tenants_webhook(
    engine, settings, db
):
    tuned = settings.model_copy(
        update={
            "webhooks_allow_private": True,
            "webhooks_timeout_s": TIMEOUT_S,
            "webhooks_delivery_threads": 4,
            "webhooks_endpoint_concurrency": 2,
            "webhooks_round_s": 3 * TIMEOUT_S,
        }
    )
    sender = WebhookSender()
    with Receiver() as hanging, Receiver() as healthy:
        hanging.secrets = [add_endpoint(engine, settings, hanging.url)[1]]
        _, secret = add_endpoint(engine, settings, healthy.url, tenant="globex")
        healthy.secrets = [secret]
        # acme's backlog is older: a claim in due order alone would take it first.
        for i in range(20):
            notify(engine, "run.status_changed", status=f"acme {i}")
        notify(engine, "run.status_changed", tenant="globex", status="globex")
        fan_out_pending(engine, tuned, now)
        hanging.hang.set()
        started = time.monotonic()
        round_ = threading.Thread(target=deliver_due, args=(engine, tuned, sender, now))
        round_.start()
        try:
            wait_for(lambda: len(healthy.processed) == 1, 3 * TIMEOUT_S)
            took = time.monotonic() - started
            assert hanging.hung.is_set()
            assert took < TIMEOUT_S / 2, f"globex waited {took:.1f}s behind acme's receiver"
            sending_to_acme = db.execute(
                "SELECT count(*) FROM webhook_messages WHERE tenant_id = 'acme' "
                "AND claimed_until IS NOT NULL"
            ).fetchone()[0]
            assert sending_to_acme <= 8 * 2  # its claim share, however long its backlog
        finally:
            hanging.hang.clear()
            round_.join(60)
    sender.close()
    statuses = dict(
        db.execute(
            "SELECT tenant_id, array_agg(DISTINCT status) FROM webhook_messages GROUP BY 1"
        ).fetchall()
    )
    assert statuses["globex"] == ["delivered"]
