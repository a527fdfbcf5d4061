"""A global rate limit per wall-clock second, answered with Stripe's 429 ``rate_limit``."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import stripe

from devtools.stripe_emulator import EmulatorServer
from devtools.stripe_emulator.control_client import EmulatorControl
from tests.devtools.stripe_emulator.invoicing_harness import sdk

LIMIT = 4
REQUESTS = 12


def _list_customers(url: str) -> str:
    try:
        sdk(url).v1.customers.list()
    except stripe.RateLimitError as exc:
        body = (exc.json_body or {})["error"]
        assert (exc.http_status, body["code"], body["type"]) == (
            429,
            "rate_limit",
            "invalid_request_error",
        )
        return "429"
    return "200"


def test_requests_over_the_global_limit_get_429_rate_limit(
    server: EmulatorServer, control: EmulatorControl
) -> None:
    control.settings(rate_limit_per_s=LIMIT)

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=REQUESTS) as pool:
        outcomes = list(pool.map(_list_customers, [server.url] * REQUESTS))
    elapsed_s = time.monotonic() - started

    # At most LIMIT per started second; the rest are refused, and nothing else happens.
    assert outcomes.count("200") <= LIMIT * (int(elapsed_s) + 1)
    assert outcomes.count("429") >= 1
    time.sleep(1.0)
    assert _list_customers(server.url) == "200"


def test_meter_events_have_their_own_limit_apart_from_the_global_one(
    server: EmulatorServer, control: EmulatorControl, meter: stripe.billing.Meter
) -> None:
    control.settings(rate_limit_per_s=1, meter_event_rate_limit_per_s=1000)
    time.sleep(1.0)
    client = sdk(server.url)
    client.v1.customers.list()

    for index in range(3):
        client.v1.billing.meter_events.create(
            params={
                "event_name": "fairmeter_usage",
                "identifier": f"r{index}",
                "payload": {"stripe_customer_id": "cus_x", "value": "1"},
            }
        )

    assert control.state()["counters"].get("status:429", 0) == 0
