"""The HTTP layer: authentication, form encoding, the control API, clean shutdown."""

from __future__ import annotations

import threading
import urllib.error

import pytest
import stripe

from devtools.stripe_emulator import EmulatorServer
from devtools.stripe_emulator.control_client import EmulatorControl
from devtools.stripe_emulator.forms import parse_form
from tests.devtools.stripe_emulator.harness import make_client


def test_missing_or_live_api_key_is_an_authentication_error(server: EmulatorServer) -> None:
    live = stripe.StripeClient("sk_live_x", base_addresses={"api": server.url})

    with pytest.raises(stripe.AuthenticationError) as raised:
        live.v1.customers.list()

    assert raised.value.http_status == 401


def test_unknown_object_is_a_404_resource_missing(client: stripe.StripeClient) -> None:
    with pytest.raises(stripe.InvalidRequestError) as raised:
        client.v1.billing.meters.retrieve("mtr_missing")

    assert (raised.value.http_status, raised.value.code) == (404, "resource_missing")
    assert raised.value.json_body["error"]["type"] == "invalid_request_error"


def test_unknown_parameter_is_refused(client: stripe.StripeClient) -> None:
    with pytest.raises(stripe.InvalidRequestError) as raised:
        client.v1.customers.create(params={"favourite_colour": "blue"})  # type: ignore[typeddict-unknown-key]

    assert (raised.value.code, raised.value.param) == ("parameter_unknown", "favourite_colour")


def test_bracketed_form_keys_become_nested_dicts_and_lists() -> None:
    parsed = parse_form(
        "payload[value]=12&payload[stripe_customer_id]=cus_1&expand[]=a&expand[]=b"
        "&items[0][price]=p1&items[1][price]=p2&metadata[note]=&plain=x%20y"
    )

    assert parsed == {
        "payload": {"value": "12", "stripe_customer_id": "cus_1"},
        "expand": ["a", "b"],
        "items": [{"price": "p1"}, {"price": "p2"}],
        "metadata": {"note": ""},
        "plain": "x y",
    }


def test_control_api_moves_the_clock_and_reports_unknown_routes(
    control: EmulatorControl, server: EmulatorServer
) -> None:
    control.set_clock(1_800_000_000, frozen=True)
    control.advance_clock(30)

    assert server.state.clock.now() == 1_800_000_030
    with pytest.raises(urllib.error.HTTPError) as raised:
        control._call("POST", "/nowhere", {})
    assert raised.value.code == 404


def test_reset_forgets_objects_keys_and_faults(
    client: stripe.StripeClient, control: EmulatorControl, server: EmulatorServer
) -> None:
    client.v1.customers.create(params={}, options={"idempotency_key": "c1"})
    control.inject_faults(next=["500"])

    control.reset()

    assert server.state.customers == {}
    assert control.state()["faults"]["next"] == []
    assert control.state()["idempotency_keys"] == 0


def test_stop_closes_keep_alive_connections_and_joins_every_thread() -> None:
    before = set(threading.enumerate())
    server = EmulatorServer()
    server.start()
    clients = [make_client(server.url) for _ in range(3)]
    for sdk in clients:
        sdk.v1.customers.create(params={})  # each leaves a keep-alive connection open

    server.stop()

    assert set(threading.enumerate()) - before == set()
