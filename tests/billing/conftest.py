"""The Stripe emulator as a real HTTP server, our settings pointed at it, linked customers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import stripe

from devtools.stripe_emulator import EmulatorServer
from devtools.stripe_emulator.control_client import EmulatorControl
from metering.billing.service import link_customer
from metering.config import Settings
from tests.billing.harness import SNAPSHOT_SECRET, THIN_SECRET

# Stripe's behaviour as documented, with one convenience: a customer is subscribed to a
# metered price on its first usage, as an account's sign-up flow would do, so tests that
# are not about subscriptions need not make one. Summaries lag, validation is asynchronous
# and the sandbox rate limits apply (the emulator's defaults); a test that needs one of
# them off says why where it switches it.
BILLING_EMULATOR: dict[str, Any] = {"auto_subscribe": True}


@pytest.fixture
def emulator() -> Iterator[EmulatorServer]:
    server = EmulatorServer(settings=BILLING_EMULATOR)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def control(emulator: EmulatorServer) -> EmulatorControl:
    return EmulatorControl(emulator.url)


@pytest.fixture
def stripe_settings(settings: Settings, emulator: EmulatorServer) -> Settings:
    """Retries are ours (SDK retries off), fast backoff, short timeouts and leases."""
    return settings.model_copy(
        update={
            "stripe_api_base": emulator.url,
            "stripe_max_network_retries": 0,
            "stripe_timeout_s": 0.3,
            "stripe_backoff_base_s": 0.01,
            "stripe_backoff_max_s": 0.05,
            "stripe_push_threads": 20,
            "stripe_push_lease_s": 2,
            "stripe_webhook_secret": SNAPSHOT_SECRET,
            "stripe_thin_webhook_secret": THIN_SECRET,
            "stripe_rate_limit_per_s": 25.0,  # a sandbox key's rate ("Rate limits")
        }
    )


class PatientClient(stripe.RequestsClient):
    """The SDK's own client, retrying a 429 as "Rate limits" advises ("watch for 429 status
    codes and build in a retry mechanism … exponential backoff"); the SDK leaves that to
    its caller."""

    def _should_retry(
        self,
        response: Any,
        api_connection_error: Any,
        num_retries: int,
        max_network_retries: int | None,
    ) -> bool:
        if response is not None and response[1] == 429:
            return num_retries < (max_network_retries or 0)
        return bool(
            super()._should_retry(response, api_connection_error, num_retries, max_network_retries)
        )


@pytest.fixture
def sdk(emulator: EmulatorServer) -> stripe.StripeClient:
    """The test's own client: it shares the sandbox rate limit with the pusher, so it
    retries a 429 as the SDK does (with backoff)."""
    url = emulator.url
    return stripe.StripeClient(
        "sk_test_x",
        base_addresses={"api": url, "meter_events": url},
        max_network_retries=8,
        http_client=PatientClient(),
    )


@pytest.fixture
def link(engine: Any, sdk: stripe.StripeClient) -> Callable[[str], str]:
    """Create the customer in Stripe and record its id; returns the Stripe id."""

    def linker(customer: str, tenant: str = "acme") -> str:
        stripe_id = sdk.v1.customers.create(params={"name": customer}).id
        link_customer(engine, tenant, customer, stripe_id)
        return str(stripe_id)

    return linker


@pytest.fixture
def webhook_api(settings: Settings, stripe_settings: Settings) -> Iterator[str]:
    """The real API in its own process, with the webhook signing secret configured."""
    import subprocess
    import sys

    from tests.helpers import ROOT
    from tests.helpers.processes import free_port, service_env, wait_http

    port = free_port()
    env = service_env(settings) | {
        "FAIRMETER_STRIPE_WEBHOOK_SECRET": str(stripe_settings.stripe_webhook_secret),
        "FAIRMETER_STRIPE_THIN_WEBHOOK_SECRET": str(stripe_settings.stripe_thin_webhook_secret),
        "FAIRMETER_STRIPE_API_BASE": str(stripe_settings.stripe_api_base),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli", "serve", "--port", str(port)], cwd=ROOT, env=env
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{base}/healthz", deadline_s=120)  # a loaded machine starts slowly
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=15)
