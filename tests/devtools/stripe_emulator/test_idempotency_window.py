"""A key's first response is kept, a 500 included, and replayed for 24 h; then keys and
meter-event identifiers lapse, so a late retry of a committed event is billed twice."""

from __future__ import annotations

import pytest
import stripe

from devtools.stripe_emulator import EmulatorServer
from devtools.stripe_emulator.control_client import EmulatorControl
from tests.devtools.stripe_emulator.invoicing_harness import (
    DAY_S,
    FEB_1,
    JAN_1,
    at,
    sdk,
    send_usage,
    summed_usage,
    wait_out_summary_lag,
)

METER_EVENTS = "/v1/billing/meter_events"
NOW = at(2026, 1, 20)


def test_stored_500_is_replayed_to_every_retry_with_the_same_key(
    server: EmulatorServer,
    control: EmulatorControl,
    meter: stripe.billing.Meter,
    customer: stripe.Customer,
) -> None:
    retrying = sdk(server.url, retries=2)
    control.set_clock(NOW, frozen=True)
    control.inject_faults(next=["stored_500"], path=METER_EVENTS)

    with pytest.raises(stripe.APIError) as first:
        send_usage(retrying, customer.id, 5, timestamp=NOW, identifier="u1", key="k1")
    with pytest.raises(stripe.APIError) as retry:
        send_usage(retrying, customer.id, 5, timestamp=NOW, identifier="u1", key="k1")

    assert (first.value.http_status, retry.value.http_status) == (500, 500)
    headers = retry.value.headers or {}
    assert headers.get("Idempotent-Replayed") == "true"
    assert headers.get("Stripe-Should-Retry") == "false"  # so the SDK did not retry
    assert control.state()["counters"]["requests"] == 2 + 2  # meter, customer, two sends
    assert server.state.meter_events == []


def test_stored_500_lapses_with_its_key_after_24_hours(
    client: stripe.StripeClient,
    control: EmulatorControl,
    meter: stripe.billing.Meter,
    customer: stripe.Customer,
) -> None:
    control.set_clock(NOW, frozen=True)
    control.inject_faults(next=["stored_500"], path=METER_EVENTS)
    with pytest.raises(stripe.APIError):
        send_usage(client, customer.id, 5, timestamp=NOW, identifier="u1", key="k1")

    control.advance_clock(DAY_S - 1)
    with pytest.raises(stripe.APIError):
        send_usage(client, customer.id, 5, timestamp=NOW, identifier="u1", key="k1")
    control.advance_clock(1)
    send_usage(client, customer.id, 5, timestamp=NOW, identifier="u1", key="k1")

    wait_out_summary_lag(control)
    assert summed_usage(client, meter.id, customer.id, JAN_1, FEB_1) == 5


def test_stored_500_after_commit_hides_an_event_that_landed(
    client: stripe.StripeClient,
    control: EmulatorControl,
    meter: stripe.billing.Meter,
    customer: stripe.Customer,
) -> None:
    control.set_clock(NOW, frozen=True)
    control.inject_faults(next=["stored_500_after_commit"], path=METER_EVENTS)

    for _ in range(2):
        with pytest.raises(stripe.APIError):
            send_usage(client, customer.id, 5, timestamp=NOW, identifier="u1", key="k1")

    wait_out_summary_lag(control)
    assert summed_usage(client, meter.id, customer.id, JAN_1, FEB_1) == 5  # only summaries tell


def test_late_retry_after_the_windows_lapse_is_billed_twice(
    client: stripe.StripeClient,
    control: EmulatorControl,
    meter: stripe.billing.Meter,
    customer: stripe.Customer,
) -> None:
    control.set_clock(NOW, frozen=True)
    send_usage(client, customer.id, 5, timestamp=NOW, identifier="u1", key="k1")
    control.advance_clock(DAY_S - 1)
    replay = send_usage(client, customer.id, 5, timestamp=NOW, identifier="u1", key="k1")

    control.advance_clock(1)
    send_usage(client, customer.id, 5, timestamp=NOW, identifier="u1", key="k1")

    assert replay.last_response.headers.get("Idempotent-Replayed") == "true"
    wait_out_summary_lag(control)
    assert summed_usage(client, meter.id, customer.id, JAN_1, FEB_1) == 10


def test_a_validation_error_is_not_kept_so_a_retry_after_the_fix_executes(
    client: stripe.StripeClient,
) -> None:
    credit = {"amount": -500, "currency": "usd"}
    options = {"idempotency_key": "credit-acme-1"}
    with pytest.raises(stripe.InvalidRequestError) as missing:
        client.v1.customers.balance_transactions.create("cus_acme", params=credit, options=options)  # type: ignore[arg-type]

    client.v1.customers.create(params={"id": "cus_acme", "name": "Acme"})
    retried = client.v1.customers.balance_transactions.create(
        "cus_acme",
        params=credit,
        options=options,  # type: ignore[arg-type]
    )

    assert missing.value.code == "resource_missing"
    assert retried.last_response.headers.get("Idempotent-Replayed") is None
    assert client.v1.customers.retrieve("cus_acme").balance == -500
