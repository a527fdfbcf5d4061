"""The emulator `make up` runs keeps its objects across restarts (issue #15 §5).

Our database keeps the Stripe customer ids it linked; a second `make up` used to start an
emulator that had forgotten them, and every meter event of the second demo came back
``meter_event_customer_not_found``. A real emulator process is stopped as the launcher stops
it (SIGTERM) and started again on another port with the same state file.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.devtools.stripe_emulator.harness import EVENT_NAME, make_client
from tests.helpers.processes import free_port

START_TIMEOUT_S = 60.0


class Emulator:
    def __init__(self, state_file: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "devtools.stripe_emulator.cli"),
                *("--port", str(self.port), "--state-file", str(state_file)),
            ],
            stdout=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.healthy():
            assert self.proc.poll() is None, "the emulator exited"
            assert time.monotonic() < deadline, "the emulator did not start"
            time.sleep(0.2)

    def healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/_emulator/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def state(self) -> dict[str, Any]:
        reply: dict[str, Any] = httpx.get(f"{self.url}/_emulator/state", timeout=10).json()
        return reply

    def stop(self) -> None:
        self.proc.terminate()  # what the launcher sends
        assert self.proc.wait(timeout=30) == 0


@pytest.fixture
def emulators(tmp_path: Path) -> Iterator[list[Emulator]]:
    started: list[Emulator] = []
    yield started
    for emulator in started:
        if emulator.proc.poll() is None:
            emulator.proc.kill()
            emulator.proc.wait()


def send_usage(url: str, customer: str, identifier: str) -> None:
    make_client(url).v1.billing.meter_events.create(
        params={
            "event_name": EVENT_NAME,
            "identifier": identifier,
            "payload": {"stripe_customer_id": customer, "value": "5"},
            "timestamp": int(time.time()) - 60,
        }
    )


def test_a_restarted_emulator_still_knows_the_customers_our_database_linked(tmp_path, emulators):
    state_file = tmp_path / "stripe-emulator.json"
    first = Emulator(state_file)
    emulators.append(first)
    sdk = make_client(first.url)
    sdk.v1.billing.meters.create(
        params={
            "display_name": "Fairmeter usage",
            "event_name": EVENT_NAME,
            "default_aggregation": {"formula": "sum"},
            "customer_mapping": {"event_payload_key": "stripe_customer_id", "type": "by_id"},
            "value_settings": {"event_payload_key": "value"},
        }
    )
    customer = sdk.v1.customers.create(params={"name": "Acme"}).id
    send_usage(first.url, customer, "run:a:v1")
    first.stop()

    second = Emulator(state_file)  # a new port, as a second `make up` gives it
    emulators.append(second)
    assert second.port != first.port
    assert make_client(second.url).v1.customers.retrieve(customer).id == customer
    send_usage(second.url, customer, "run:b:v1")
    events = {event["identifier"]: event for event in second.state()["meter_events"]}
    assert set(events) == {"run:a:v1", "run:b:v1"}
    assert events["run:b:v1"]["error_code"] is None, events["run:b:v1"]
    second.stop()
