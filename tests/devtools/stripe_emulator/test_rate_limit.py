"""Stripe's rate limits per wall-clock second (global, per endpoint, meter events), on by
default at the sandbox figures, answered with Stripe's 429 ``rate_limit``."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial

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


def _outcome(call: Callable[[], object]) -> str:
    try:
        call()
    except stripe.RateLimitError:
        return "429"
    return "200"


def test_rate_limits_are_on_by_default_at_the_sandbox_figures(server: EmulatorServer) -> None:
    client = sdk(server.url)

    with ThreadPoolExecutor(max_workers=10) as pool:
        outcomes = list(pool.map(lambda _: _outcome(client.v1.customers.list), range(40)))

    assert outcomes.count("429") >= 1


def test_each_endpoint_has_its_own_limit_whatever_the_object_id(
    server: EmulatorServer, control: EmulatorControl
) -> None:
    control.settings(rate_limit_per_s=100, endpoint_rate_limit_per_s=5)  # live-mode global
    client = sdk(server.url)
    customers = [client.v1.customers.create(params={"name": f"c{n}"}) for n in range(3)]
    time.sleep(1.0)

    # Different customers, one endpoint (GET /v1/customers/{id}): one limit between them.
    retrieved = [_outcome(partial(client.v1.customers.retrieve, c.id)) for c in customers * 3]
    other_endpoint = _outcome(client.v1.customers.list)

    assert retrieved.count("429") >= 1
    assert other_endpoint == "200"
