"""The gateway's HTTP transport (metering/billing/transport.py) against the emulator."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit

import psutil
import pytest
import stripe

from devtools.stripe_emulator import EmulatorServer
from devtools.stripe_emulator.control_client import EmulatorControl
from metering.billing.gateway import build_client
from metering.config import Settings


def connections_to(url: str) -> int:
    port = urlsplit(url).port
    return sum(
        c.status == psutil.CONN_ESTABLISHED and c.raddr and c.raddr.port == port
        for c in psutil.Process(os.getpid()).net_connections(kind="tcp")
    )


def create_customer(client: stripe.StripeClient) -> Any:
    return client.v1.customers.create(params={"name": "transport"})


def test_calls_share_one_kept_alive_connection(
    stripe_settings: Settings, emulator: EmulatorServer
) -> None:
    client = build_client(stripe_settings)

    for _ in range(5):
        create_customer(client)

    assert connections_to(emulator.url) == 1
    assert emulator.state.counters["requests"] == 5


def test_read_timeout_is_a_retryable_connection_error_and_the_next_call_reconnects(
    stripe_settings: Settings, emulator: EmulatorServer, control: EmulatorControl
) -> None:
    client = build_client(stripe_settings)  # read timeout 0.3 s, SDK retries off
    control.settings(timeout_s=1.0)
    control.inject_faults(next=["timeout"], path="/v1/customers")

    with pytest.raises(stripe.APIConnectionError) as raised:
        create_customer(client)

    assert raised.value.should_retry is True
    assert create_customer(client).object == "customer"


def test_connection_the_server_closed_while_idle_is_replaced_not_reused(
    stripe_settings: Settings,
) -> None:
    first = EmulatorServer()
    first.start()
    host, port = urlsplit(first.url).hostname, urlsplit(first.url).port
    client = build_client(stripe_settings.model_copy(update={"stripe_api_base": first.url}))
    create_customer(client)
    first.stop()  # hangs up the idle keep-alive connection
    second = EmulatorServer(str(host), int(port or 0))
    second.start()
    try:
        assert create_customer(client).object == "customer"  # no error: a fresh connection
        assert second.state.counters["requests"] == 1
    finally:
        second.stop()
