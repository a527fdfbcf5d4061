"""A round lets go at its deadline of what it claimed and has not started (issue #30): the
messages are due again at once to any round, with ``attempts`` and ``tries`` as if they had
never been claimed, while the one send running finishes. Before the fix the round held them,
counted as attempted, until each had had its turn behind the hanging send."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

from metering.webhooks.delivery import deliver_due
from metering.webhooks.fanout import fan_out_pending
from reconciler.webhook_sender import WebhookSender
from tests.helpers.webhooks import Receiver, add_endpoint, notify, wait_for

TIMEOUT_S = 4.0
ROUND_S = 0.5


def now() -> datetime:
    return datetime.now(UTC)


def test_a_round_lets_go_at_its_deadline_of_what_it_has_not_sent(engine, settings, db):
    tuned = settings.model_copy(
        update={
            "webhooks_allow_private": True,
            "webhooks_timeout_s": TIMEOUT_S,
            "webhooks_delivery_threads": 1,
            "webhooks_endpoint_concurrency": 1,
            "webhooks_round_s": ROUND_S,
        }
    )
    sender = WebhookSender()
    with Receiver() as hanging:
        hanging.secrets = [add_endpoint(engine, settings, hanging.url)[1]]
        for i in range(5):
            notify(engine, "run.status_changed", status=f"step {i}")
        fan_out_pending(engine, tuned, now)
        hanging.hang.set()
        started = time.monotonic()
        round_ = threading.Thread(target=deliver_due, args=(engine, tuned, sender, now))
        round_.start()
        try:
            wait_for(hanging.hung.is_set, TIMEOUT_S)
            # Past the deadline, the first send still hanging.
            time.sleep(max(0.0, started + 2 * ROUND_S - time.monotonic()))
            rows = db.execute(
                "SELECT attempts, tries, claimed_until IS NOT NULL FROM webhook_messages "
                "ORDER BY id"
            ).fetchall()
            assert time.monotonic() - started < TIMEOUT_S, "the check came too late"
        finally:
            hanging.hang.clear()
            round_.join(60)
    sender.close()
    # One being sent; the others let go: never attempted, claimable at once.
    assert sorted(rows) == [(0, 0, False)] * 4 + [(1, 1, True)]
