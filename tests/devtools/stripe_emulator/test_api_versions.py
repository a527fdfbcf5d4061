"""``Stripe-Version``: a request gets its version's shapes, an unknown version a 400, and a
request without the header the account's default version."""

from __future__ import annotations

import httpx
import pytest
import stripe

from devtools.stripe_emulator import EmulatorServer
from devtools.stripe_emulator.control_client import EmulatorControl
from tests.devtools.stripe_emulator.invoicing_harness import (
    FEB_1,
    HOUR_S,
    at,
    invoices_of,
    send_usage,
)

pytestmark = pytest.mark.usefixtures("auto_subscribe")
ACACIA = "2025-02-24.acacia"  # before 2025-03-31.basil moved a line's price under pricing


def _client(url: str, version: str) -> stripe.StripeClient:
    return stripe.StripeClient(
        "sk_test_emulator", base_addresses={"api": url}, stripe_version=version
    )


@pytest.fixture
def invoice_id(
    client: stripe.StripeClient,
    control: EmulatorControl,
    meter: stripe.billing.Meter,
    customer: stripe.Customer,
) -> str:
    control.set_clock(at(2026, 1, 20), frozen=True)
    send_usage(client, customer.id, 10, timestamp=at(2026, 1, 19), identifier="u1")
    control.set_clock(FEB_1 + HOUR_S, frozen=True)
    (invoice,) = invoices_of(client, customer.id)
    return str(invoice.id)


def test_a_line_names_its_price_where_the_requested_version_puts_it(
    server: EmulatorServer, client: stripe.StripeClient, invoice_id: str
) -> None:
    (current,) = client.v1.invoices.retrieve(invoice_id).lines.data
    (older,) = _client(server.url, ACACIA).v1.invoices.retrieve(invoice_id).lines.data

    price_id = current.pricing.price_details.price
    assert older.price.id == price_id
    assert older.price.recurring.usage_type == "metered"
    assert "pricing" not in older


def test_an_unknown_version_is_refused_with_a_400(server: EmulatorServer) -> None:
    with pytest.raises(stripe.InvalidRequestError) as refused:
        _client(server.url, "2025-01-15.basil").v1.customers.list()  # basil began 2025-03-31

    assert refused.value.http_status == 400
    assert "Invalid Stripe API version: 2025-01-15.basil" in refused.value.user_message


def test_a_request_without_the_header_gets_the_accounts_default_version(
    server: EmulatorServer, control: EmulatorControl, invoice_id: str
) -> None:
    control.settings(api_version=ACACIA)

    reply = httpx.get(
        f"{server.url}/v1/invoices/{invoice_id}",
        headers={"Authorization": "Bearer sk_test_emulator"},
        timeout=10,
    )

    (line,) = reply.json()["lines"]["data"]
    assert reply.headers["Stripe-Version"] == ACACIA
    assert line["price"]["object"] == "price" and "pricing" not in line
