"""Injected faults as the SDK experiences them, and the per-customer concurrency rule."""

from __future__ import annotations

import threading
import time

import pytest
import stripe

from devtools.stripe_emulator import EmulatorServer
from devtools.stripe_emulator.control_client import EmulatorControl
from tests.devtools.stripe_emulator.harness import SendEvent, make_client

METER_EVENTS = "/v1/billing/meter_events"


def test_injected_429_raises_rate_limit_error_and_processes_nothing(
    send_event: SendEvent, control: EmulatorControl, server: EmulatorServer
) -> None:
    control.inject_faults(next=["429"], path=METER_EVENTS)

    with pytest.raises(stripe.RateLimitError):
        send_event("run:1:v1", key="k1")

    assert server.state.meter_events == []
    send_event("run:1:v1", key="k1")  # nothing was stored under the key either
    assert control.state()["counters"]["fault:429"] == 1


def test_injected_500_raises_api_error_and_processes_nothing(
    send_event: SendEvent, control: EmulatorControl, server: EmulatorServer
) -> None:
    control.inject_faults(next=["500"], path=METER_EVENTS)

    with pytest.raises(stripe.APIError) as raised:
        send_event("run:2:v1", key="k2")

    assert raised.value.http_status == 500
    assert server.state.meter_events == []


def test_injected_timeout_raises_connection_error_and_processes_nothing(
    send_event: SendEvent, control: EmulatorControl, server: EmulatorServer
) -> None:
    control.settings(timeout_s=1.0)
    control.inject_faults(next=["timeout"], path=METER_EVENTS)
    impatient = make_client(server.url, timeout_s=0.3)

    with pytest.raises(stripe.APIConnectionError):
        send_event("run:3:v1", via=impatient, key="k3")

    assert server.state.meter_events == []


def test_dropped_response_after_commit_keeps_the_event_and_the_key_replays_it(
    send_event: SendEvent, control: EmulatorControl, server: EmulatorServer
) -> None:
    control.inject_faults(next=["drop_after_commit"], path=METER_EVENTS)

    with pytest.raises(stripe.APIConnectionError):
        send_event("run:4:v1", 6, key="k4")

    assert [(e.identifier, e.value) for e in server.state.meter_events] == [("run:4:v1", 6)]
    retried = send_event("run:4:v1", 6, key="k4")
    assert retried.identifier == "run:4:v1"
    assert retried.last_response.headers["Idempotent-Replayed"] == "true"
    assert len(server.state.meter_events) == 1


def test_sdk_retry_after_a_dropped_response_is_replayed_not_duplicated(
    send_event: SendEvent, control: EmulatorControl, server: EmulatorServer
) -> None:
    control.inject_faults(next=["drop_after_commit"], path=METER_EVENTS)
    patient = make_client(server.url, retries=2)

    event = send_event("run:10:v1", 2, via=patient)  # the SDK's own key, reused on retry

    assert event.last_response.headers["Idempotent-Replayed"] == "true"
    assert [(e.identifier, e.value) for e in server.state.meter_events] == [("run:10:v1", 2)]


def test_sdk_retries_recover_from_one_injected_500(
    send_event: SendEvent, control: EmulatorControl, server: EmulatorServer
) -> None:
    control.inject_faults(next=["500"], path=METER_EVENTS)
    patient = make_client(server.url, retries=2)

    event = send_event("run:5:v1", via=patient, key="k5")

    assert event.identifier == "run:5:v1"
    counters = control.state()["counters"]
    assert (counters["fault:500"], counters["status:500"]) == (1, 1)
    assert len(server.state.meter_events) == 1


def test_random_fault_plan_is_reproducible_from_its_seed(
    send_event: SendEvent, control: EmulatorControl
) -> None:
    def outcomes() -> list[str]:
        control.inject_faults(rate=0.5, kinds=["429", "500"], seed=7, path=METER_EVENTS)
        seen = []
        for i in range(20):
            try:
                send_event(f"seed:{len(seen)}:{i}:{time.monotonic_ns()}")
                seen.append("ok")
            except stripe.StripeError as exc:
                seen.append(type(exc).__name__)
        return seen

    first, second = outcomes(), outcomes()
    assert first == second and {"ok", "RateLimitError", "APIError"} == set(first)


def test_overlapping_requests_for_one_customer_get_lock_timeout(
    client: stripe.StripeClient,
    send_event: SendEvent,
    control: EmulatorControl,
    server: EmulatorServer,
) -> None:
    control.settings(slow_s=1.0)
    control.inject_faults(next=["slow"], path=METER_EVENTS)
    held: list[stripe.billing.MeterEvent] = []
    holder = threading.Thread(
        target=lambda: held.append(send_event("run:6:v1", via=make_client(server.url)))
    )
    holder.start()
    _wait_until(lambda: bool(server.state.in_flight))

    with pytest.raises(stripe.RateLimitError) as raised:
        send_event("run:7:v1")
    someone_else = client.v1.customers.create(params={"name": "Other"})
    send_event("run:8:v1", customer_id=someone_else.id)
    holder.join()

    assert raised.value.error is not None and raised.value.error.code == "lock_timeout"
    assert raised.value.headers["Stripe-Should-Retry"] == "true"
    assert [e.identifier for e in held] == ["run:6:v1"]
    assert [e.identifier for e in server.state.meter_events] == ["run:6:v1", "run:8:v1"]


def test_lock_rule_can_be_switched_off(
    send_event: SendEvent, control: EmulatorControl, server: EmulatorServer
) -> None:
    control.settings(slow_s=0.6, lock_rule=False)
    control.inject_faults(next=["slow"], path=METER_EVENTS)
    holder = threading.Thread(
        target=send_event, args=("run:8:v1",), kwargs={"via": make_client(server.url)}
    )
    holder.start()
    _wait_until(lambda: bool(server.state.in_flight))

    send_event("run:9:v1")
    holder.join()

    assert len(server.state.meter_events) == 2


def _wait_until(condition: object, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)
