"""Issue #20: two event destinations, each with its own signing secret and payload style;
the API version pinned in one place; a client-side rate limit at Stripe's rate."""

from __future__ import annotations

import json
import time

import httpx
import stripe

from devtools.stripe_emulator.webhooks import signature_header
from metering.billing.gateway import build_client
from metering.billing.ratelimit import RateLimiter
from tests.billing.harness import SNAPSHOT_SECRET, THIN_SECRET

THIN = {
    "id": "evt_thin_1",
    "object": "v2.core.event",
    "type": "v1.billing.meter.error_report_triggered",
    "created": "2026-12-01T00:00:00.000Z",
    "livemode": False,
    "related_object": {"id": "mtr_1", "type": "billing.meter", "url": "/v1/billing/meters/mtr_1"},
}
SNAPSHOT = {
    "id": "evt_snap_1",
    "object": "event",
    "type": "invoice.created",
    "data": {"object": {"id": "in_1", "object": "invoice"}},
}


def post(base: str, route: str, event: dict, secret: str) -> httpx.Response:
    payload = json.dumps(event)
    return httpx.post(
        f"{base}{route}",
        content=payload,
        timeout=10,
        headers={
            "content-type": "application/json",
            "stripe-signature": signature_header(payload, secret),
        },
    )


def test_each_destination_takes_its_own_secret_and_style_only(webhook_api, db):
    refused = [
        post(webhook_api, "/webhooks/stripe/thin", THIN, SNAPSHOT_SECRET),  # wrong secret
        post(webhook_api, "/webhooks/stripe", SNAPSHOT, THIN_SECRET),
        post(webhook_api, "/webhooks/stripe", THIN, SNAPSHOT_SECRET),  # wrong style
        post(webhook_api, "/webhooks/stripe/thin", SNAPSHOT, THIN_SECRET),
    ]
    assert [r.status_code for r in refused] == [400] * 4, [r.text for r in refused]
    assert db.execute("SELECT count(*) FROM stripe_webhook_inbox").fetchone() == (0,)
    thin = post(webhook_api, "/webhooks/stripe/thin", THIN, THIN_SECRET)
    snapshot = post(webhook_api, "/webhooks/stripe", SNAPSHOT, SNAPSHOT_SECRET)
    assert (thin.status_code, snapshot.status_code) == (200, 200), (thin.text, snapshot.text)
    stored = db.execute("SELECT event_id, type FROM stripe_webhook_inbox ORDER BY 1").fetchall()
    assert stored == [("evt_snap_1", "invoice.created"), ("evt_thin_1", THIN["type"])]


def test_the_api_version_is_pinned_to_the_sdks_own(stripe_settings):
    client = build_client(stripe_settings)
    assert client._requestor._options.stripe_version == stripe_settings.stripe_api_version
    # Bumping the SDK without the pin (or the other way round) fails here, not in billing.
    assert stripe_settings.stripe_api_version == stripe._api_version._ApiVersion.CURRENT


def test_the_rate_limit_spreads_calls_at_the_configured_rate():
    limiter = RateLimiter(50.0)  # a second's burst, then 50 per second
    started = time.monotonic()
    for _ in range(75):
        limiter.acquire()
    assert time.monotonic() - started >= 0.45
