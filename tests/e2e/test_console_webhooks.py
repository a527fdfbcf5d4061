"""The console's Webhooks pages in headless Chromium: an admin sees an endpoint and its
delivery log and redelivers (one message, and everything since a time); a support key
cannot. Deliveries go to a real receiver on loopback through the worker's own code path
(fan-out, then ``deliver_due`` with the worker's ``WebhookSender``), in this process."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from metering.webhooks.delivery import deliver_due
from metering.webhooks.fanout import fan_out_pending
from reconciler.webhook_sender import WebhookSender
from tests.e2e.conftest import WAIT_MS
from tests.e2e.test_console import _OVERFLOWS, sign_in
from tests.helpers.events import usage
from tests.helpers.ingest import ingest
from tests.helpers.webhooks import Receiver, add_endpoint, notify, wait_for

pytestmark = pytest.mark.timeout(300)


def _now() -> datetime:
    return datetime.now(UTC)


@pytest.fixture
def delivered(engine, settings, db) -> Any:
    """A settled-run message delivered to a live receiver: (receiver, endpoint id, run,
    message id, a function that runs one delivery round as the worker does)."""
    run = f"hooked-{uuid.uuid4().hex[:6]}"
    ingest(engine, settings, [usage(run=run, customer="cust-1")])
    private = settings.model_copy(update={"webhooks_allow_private": True})
    sender = WebhookSender()

    def deliver_round() -> None:
        fan_out_pending(engine, private, _now)
        deliver_due(engine, private, sender, _now)

    with Receiver() as receiver:
        endpoint_id, secret = add_endpoint(engine, settings, receiver.url)
        receiver.secrets = [secret]
        notify(engine, "run.settled", customer_id="cust-1", run=run, outcome="billed")
        deliver_round()
        wait_for(lambda: len(receiver.processed) == 1)
        [message_id] = receiver.processed
        yield receiver, endpoint_id, run, message_id, deliver_round


def _message(db: Any, message_id: str) -> tuple[str, int]:
    row = db.execute(
        "SELECT status, attempts FROM webhook_messages WHERE msg_id = %s", (message_id,)
    ).fetchone()
    return row[0], row[1]


@pytest.mark.parametrize("width", [1366, 420])
def test_an_admin_sees_the_endpoint_and_its_delivery_and_redelivers_it(
    live_server, browser, make_key, delivered, db, artifacts, width
):
    receiver, endpoint_id, run, message_id, deliver_round = delivered
    context = browser.new_context(viewport={"width": width, "height": 900})
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    try:
        sign_in(page, live_server, make_key(scope="admin"))
        page.click("#nav-webhooks")
        page.wait_for_url(f"{live_server}/console/webhooks")
        row = page.locator(f'#endpoints tr[data-endpoint="{endpoint_id}"]')
        assert receiver.url in row.inner_text()
        assert row.locator('[data-state="enabled"]').is_visible()
        assert " UTC" in row.inner_text()
        assert page.evaluate(_OVERFLOWS) == [], width
        page.screenshot(path=str(artifacts / f"console-webhooks-{width}.png"), full_page=True)

        row.locator("a").click()
        page.wait_for_url(f"{live_server}/console/webhooks/{endpoint_id}")
        delivery = page.locator(f'#deliveries tr[data-message="{message_id}"]')
        assert delivery.get_attribute("data-status") == "delivered"
        assert "run.settled" in delivery.inner_text()
        assert delivery.locator(f'a[href="/console/runs/{run}"]').is_visible()
        first = delivery.locator('.attempt[data-attempt="1"]')
        assert first.get_attribute("data-outcome") == "delivered"
        assert "200" in first.inner_text() and " ms" in first.inner_text()
        assert '"ok": true' in first.locator(".excerpt").inner_text()
        assert delivery.locator(".next-attempt").inner_text() == "—"
        assert page.evaluate(_OVERFLOWS) == [], width
        page.screenshot(path=str(artifacts / f"console-webhook-log-{width}.png"), full_page=True)

        delivery.locator("button.redeliver").click()
        page.wait_for_url(f"{live_server}/console/webhooks/{endpoint_id}")
        assert f"Message {message_id} queued again" in page.locator("#flash").inner_text()
        assert delivery.get_attribute("data-status") == "pending"
        assert delivery.locator(".next-attempt").inner_text().endswith(" UTC")
        deliver_round()
        wait_for(lambda: len(receiver.received(message_id)) == 2)
        again = receiver.received(message_id)[1]
        assert again.verified and again.body == receiver.received(message_id)[0].body
        assert receiver.processed == [message_id]  # the receiver's dedupe: acted on once

        since = (_now() - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S")
        page.fill("#since", since)
        page.click("#redeliver-since-button")
        page.wait_for_url(f"{live_server}/console/webhooks/{endpoint_id}")
        assert "1 message since" in page.locator("#flash").inner_text()
        assert _message(db, message_id) == ("pending", 2)
        deliver_round()
        wait_for(lambda: len(receiver.received(message_id)) == 3)
        page.reload()
        assert delivery.get_attribute("data-status") == "delivered"
        assert delivery.locator(".attempt").count() == 3
        assert page.evaluate(_OVERFLOWS) == [], width
    finally:
        context.close()


def test_a_support_key_cannot_see_or_redeliver_webhooks(live_server, page, make_key, delivered, db):
    _, endpoint_id, _, message_id, _ = delivered
    sign_in(page, live_server, make_key(scope="support"))
    assert page.locator("#nav-webhooks").count() == 0
    csrf = page.locator('form[action="/console/logout"] input[name="csrf"]').get_attribute("value")
    for path in ("/console/webhooks", f"/console/webhooks/{endpoint_id}"):
        reply = page.goto(f"{live_server}{path}")
        assert reply is not None and reply.status == 403, path
        assert "webhooks need admin" in page.locator("main").inner_text()
    base = f"{live_server}/console/webhooks/{endpoint_id}"
    for url, form in (
        (f"{base}/messages/{message_id}/redeliver", {"csrf": csrf or ""}),
        (f"{base}/redeliver", {"csrf": csrf or "", "since": "2020-01-01T00:00"}),
    ):
        reply = page.request.post(url, form=form, max_redirects=0)
        assert reply.status == 403, url
    assert _message(db, message_id) == ("delivered", 1)


def test_a_redeliver_since_time_that_is_no_time_is_refused_and_changes_nothing(
    live_server, page, make_key, delivered, db
):
    _, endpoint_id, _, message_id, _ = delivered
    sign_in(page, live_server, make_key(scope="admin"))
    page.goto(f"{live_server}/console/webhooks/{endpoint_id}")
    csrf = page.locator('#redeliver-since input[name="csrf"]').get_attribute("value")
    reply = page.request.post(
        f"{live_server}/console/webhooks/{endpoint_id}/redeliver",
        form={"csrf": csrf or "", "since": "yesterday"},
        max_redirects=0,
    )
    assert reply.status == 422
    assert "Nothing was sent again" in reply.text()
    assert _message(db, message_id) == ("delivered", 1)
