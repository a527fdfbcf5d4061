"""Fixtures: a fresh emulator per test, and the official SDK pointed at it over HTTP."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import stripe

from devtools.stripe_emulator import EmulatorServer
from devtools.stripe_emulator.control_client import EmulatorControl
from tests.devtools.stripe_emulator.harness import EVENT_NAME, Inbox, SendEvent, make_client


@pytest.fixture
def server() -> Iterator[EmulatorServer]:
    emulator = EmulatorServer()
    emulator.start()
    yield emulator
    emulator.stop()


@pytest.fixture
def client(server: EmulatorServer) -> stripe.StripeClient:
    return make_client(server.url)


@pytest.fixture
def control(server: EmulatorServer) -> EmulatorControl:
    return EmulatorControl(server.url)


@pytest.fixture
def meter(client: stripe.StripeClient) -> stripe.billing.Meter:
    return client.v1.billing.meters.create(
        params={
            "display_name": "Fairmeter usage",
            "event_name": EVENT_NAME,
            "default_aggregation": {"formula": "sum"},
            "customer_mapping": {"event_payload_key": "stripe_customer_id", "type": "by_id"},
            "value_settings": {"event_payload_key": "value"},
        }
    )


@pytest.fixture
def customer(client: stripe.StripeClient, meter: stripe.billing.Meter) -> stripe.Customer:
    return client.v1.customers.create(params={"email": "ops@example.com", "name": "Acme"})


@pytest.fixture
def hour(control: EmulatorControl) -> int:
    """An hour boundary; the emulator clock is frozen ten minutes into it."""
    start = (int(time.time()) // 3600 - 2) * 3600
    control.set_clock(start + 600, frozen=True)
    return start


@pytest.fixture
def send_event(client: stripe.StripeClient, customer: stripe.Customer, hour: int) -> SendEvent:
    def send(
        identifier: str,
        value: int = 1,
        *,
        via: stripe.StripeClient | None = None,
        key: str | None = None,
        timestamp: int | None = None,
        customer_id: str | None = None,
    ) -> stripe.billing.MeterEvent:
        params: dict[str, Any] = {
            "event_name": EVENT_NAME,
            "identifier": identifier,
            "payload": {"stripe_customer_id": customer_id or customer.id, "value": str(value)},
            "timestamp": hour + 60 if timestamp is None else timestamp,
        }
        options: dict[str, Any] = {"idempotency_key": key} if key else {}
        return (via or client).v1.billing.meter_events.create(params=params, options=options)  # type: ignore[arg-type]

    return send


@pytest.fixture
def inbox() -> Iterator[Inbox]:
    with Inbox() as endpoint:
        yield endpoint


@pytest.fixture
def auto_subscribe(control: EmulatorControl) -> None:
    """A test convenience for modules about invoices and credit notes, not about how one
    subscribes: a customer's first accepted meter event subscribes it (UTC months, 1 minor
    unit per meter unit). Stripe subscribes no one by itself; test_subscriptions.py covers
    ``POST /v1/subscriptions``."""
    control.settings(auto_subscribe=True)
