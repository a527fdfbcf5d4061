"""Another tenant's webhooks next to a hanging endpoint (issue #30): a real worker and beat,
tenant acme with 40 runs' messages for one (or three) endpoints that hang past the timeout,
tenant globex with a prompt receiver. globex's latency (notification recorded → request
arrived) stays within twice its baseline, measured in the same test with acme's receivers
prompt. Before the fix a round waited for all 40 of acme's claimed messages, eight at a
time, each until the timeout, and no other round could claim globex's meanwhile."""

from __future__ import annotations

import statistics
import time
from typing import Any

import pytest

from tests.helpers.webhooks import Receiver, add_endpoint, customer, notify, wait_for

pytestmark = pytest.mark.timeout(300)

TIMEOUT_S = 3.0
WORKER_ENV = {
    "FAIRMETER_WEBHOOKS_ALLOW_PRIVATE": "true",
    "FAIRMETER_WEBHOOKS_TIMEOUT_S": str(TIMEOUT_S),
    # Scaled with the timeout as production's (10 s rounds, 15 s timeout).
    "FAIRMETER_WEBHOOKS_ROUND_S": str(TIMEOUT_S * 2 / 3),
    # acme's failed messages come back after the test (their retries are not the point).
    "FAIRMETER_WEBHOOKS_RETRY_SCHEDULE_S": "[600]",
}
ACME_RUNS = 40
PROBES = 8
# Not a multiple of the beat's second: the probes sample every phase of it.
PROBE_EVERY_S = 0.7


def probe_latencies(engine: Any, receiver: Receiver, phase: str) -> list[float]:
    """globex's latencies: one notification every PROBE_EVERY_S, each timed from its commit
    to its request's arrival."""
    sent: dict[str, float] = {}
    for i in range(PROBES):
        name = f"{phase}-{i}"
        notify(engine, "run.status_changed", tenant="globex", customer_id="globex", probe=name)
        sent[name] = time.monotonic()
        time.sleep(PROBE_EVERY_S)

    def arrived() -> dict[str, float]:
        return {
            r.payload["data"]["probe"]: r.arrived_s
            for r in receiver.accepted()
            if r.payload["data"].get("probe") in sent
        }

    wait_for(lambda: len(arrived()) == PROBES, 20 * TIMEOUT_S)
    return [arrived()[name] - at for name, at in sent.items()]


def acme_backlog(engine: Any) -> None:
    for i in range(ACME_RUNS):
        notify(engine, "run.status_changed", customer_id="acme", status=f"acme {i}")


def latencies_next_to(engine: Any, settings: Any, acme_endpoints: int) -> tuple[float, float]:
    """globex's mean latency with acme's receivers prompt, then with them hanging."""
    customer(engine, "acme", "acme")
    customer(engine, "globex", "globex")
    acme = [Receiver() for _ in range(acme_endpoints)]
    with Receiver() as globex:
        globex.secrets = [add_endpoint(engine, settings, globex.url, tenant="globex")[1]]
        for receiver in acme:
            receiver.start()
            receiver.secrets = [add_endpoint(engine, settings, receiver.url)[1]]
        try:
            acme_backlog(engine)  # the worker is up and has delivered: a warm baseline
            wait_for(lambda: all(len(r.processed) == ACME_RUNS for r in acme), 20 * TIMEOUT_S)
            acme_backlog(engine)
            baseline = probe_latencies(engine, globex, "baseline")
            for receiver in acme:
                receiver.hang.set()
            acme_backlog(engine)
            wait_for(lambda: all(r.hung.is_set() for r in acme), 10 * TIMEOUT_S)
            noisy = probe_latencies(engine, globex, "noisy")
        finally:
            for receiver in acme:
                receiver.hang.clear()
                receiver.stop()
    baseline_s, noisy_s = statistics.mean(baseline), statistics.mean(noisy)
    print(
        f"globex mean latency: baseline {baseline_s:.2f} s, next to {acme_endpoints} hanging "
        f"{noisy_s:.2f} s (x{noisy_s / baseline_s:.2f}); "
        f"max {max(baseline):.2f} / {max(noisy):.2f} s"
    )
    return baseline_s, noisy_s


def test_another_tenants_webhooks_keep_their_latency_next_to_a_hanging_endpoint(
    webhook_worker, engine, settings, db
):
    baseline_s, noisy_s = latencies_next_to(engine, settings, 1)
    assert noisy_s <= 2 * baseline_s, f"{noisy_s:.2f}s next to a hanging endpoint"


def test_another_tenants_webhooks_keep_their_latency_next_to_three_hanging_endpoints(
    webhook_worker, engine, settings, db
):
    baseline_s, noisy_s = latencies_next_to(engine, settings, 3)
    assert noisy_s <= 2 * baseline_s, f"{noisy_s:.2f}s next to three hanging endpoints"
