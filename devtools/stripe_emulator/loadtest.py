"""Measure meter events per second through the official SDK against an emulator.

    uv run python -m devtools.stripe_emulator.loadtest --processes 2 --threads 4 --events 6000

Without ``--url`` it starts the emulator in a child process, so client and server do not
share one interpreter lock. ``--trust-env`` keeps requests' per-request scan of proxy
environment variables (the SDK default), which costs the client ~0.5 ms per call.
"""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
import threading
import time
import urllib.request

import click
import requests
import stripe

from devtools.stripe_emulator.settings import NO_RATE_LIMITS

EVENT_NAME = "load_test"


def _client(url: str, trust_env: bool) -> stripe.StripeClient:
    session = requests.Session()
    session.trust_env = trust_env
    return stripe.StripeClient(
        "sk_test_load",
        base_addresses={"api": url, "meter_events": url, "files": url, "connect": url},
        max_network_retries=0,
        http_client=stripe.RequestsClient(session=session, timeout=30),
    )


def _setup(url: str, customers: int) -> list[str]:
    # The emulator's capacity is measured, not Stripe's rate limits.
    settings = urllib.request.Request(  # noqa: S310 - the emulator on loopback
        f"{url}/_emulator/settings",
        data=json.dumps(NO_RATE_LIMITS).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    urllib.request.urlopen(settings, timeout=10).close()  # noqa: S310
    client = _client(url, trust_env=False)
    client.v1.billing.meters.create(
        params={
            "display_name": "Load",
            "event_name": EVENT_NAME,
            "default_aggregation": {"formula": "sum"},
        }
    )
    return [client.v1.customers.create(params={}).id for _ in range(customers)]


def _send(client: stripe.StripeClient, customer: str, tag: str, count: int) -> int:
    failures = 0
    for index in range(count):
        try:
            client.v1.billing.meter_events.create(
                params={
                    "event_name": EVENT_NAME,
                    "identifier": f"load:{tag}:{index}",
                    "payload": {"stripe_customer_id": customer, "value": "1"},
                },
                options={"idempotency_key": f"load-key:{tag}:{index}"},
            )
        except stripe.StripeError:
            failures += 1
    return failures


def _process(
    url: str, customers: list[str], count: int, trust_env: bool
) -> tuple[float, float, int]:
    """One client process: a thread per customer; returns (start, end, failures)."""
    failures: list[int] = []

    def work(customer: str) -> None:
        client = _client(url, trust_env)  # one client (one connection) per thread
        failures.append(_send(client, customer, customer, count))

    threads = [threading.Thread(target=work, args=(c,)) for c in customers]
    started = time.time()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return started, time.time(), sum(failures)


def _start_child(port: int) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "devtools.stripe_emulator.cli", "--port", str(port)]
    child = subprocess.Popen(command, stdout=subprocess.PIPE)  # noqa: S603 - our own CLI
    assert child.stdout is not None
    child.stdout.readline()  # the URL: it is listening
    return child


@click.command()
@click.option("--processes", default=1, type=int, help="Client processes.")
@click.option("--threads", default=4, type=int, help="Client threads per process.")
@click.option("--events", default=4000, type=int, help="Total meter events.")
@click.option("--trust-env/--no-trust-env", default=False)
@click.option("--url", default=None, help="An emulator already running.")
@click.option("--port", default=12199, type=int, help="Port for the child emulator.")
def main(
    processes: int, threads: int, events: int, trust_env: bool, url: str | None, port: int
) -> None:
    child = None if url else _start_child(port)
    url = url or f"http://127.0.0.1:{port}"
    try:
        customers = _setup(url, processes * threads)  # a customer per thread: no lock clash
        per_thread = events // (processes * threads)
        jobs = [
            (url, customers[p * threads : (p + 1) * threads], per_thread, trust_env)
            for p in range(processes)
        ]
        with multiprocessing.get_context("spawn").Pool(processes) as pool:
            results = pool.starmap(_process, jobs)
        elapsed = max(r[1] for r in results) - min(r[0] for r in results)
        with urllib.request.urlopen(f"{url}/_emulator/state", timeout=60) as response:  # noqa: S310
            stored = len(json.load(response)["meter_events"])
        sent = per_thread * processes * threads
        click.echo(
            f"{sent} events, {processes} process(es) x {threads} threads, trust_env={trust_env}, "
            f"{elapsed:.2f} s: {sent / elapsed:.0f} events/s; "
            f"{sum(r[2] for r in results)} failures; {stored} events in the emulator"
        )
    finally:
        if child is not None:
            child.terminate()
            child.wait(timeout=10)


if __name__ == "__main__":
    main()
