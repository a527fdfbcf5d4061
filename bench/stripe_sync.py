"""Benchmark: outbox rows pushed to Stripe (the project's emulator) per second.

Measures, in one run: (a) the emulator's own ceiling — the official SDK creating meter events
directly from the same number of processes and threads, no database; (b) the real pusher
draining outbox rows of settled runs (claim, plan, call, record), in the same processes.
Both phases build their Stripe client with ``metering.billing.gateway.build_client`` (the same
HTTP client, timeouts and retries) and send idempotency keys, so (a) is the ceiling of exactly
the client configuration the pusher uses. Also reports the CPU time per event of each role
(client processes, emulator, PostgreSQL backends), so it is plain where the time goes.
Prints (b)/(a) and writes the result into docs/benchmarks.md. Target (issue #4): (b) ≥ 1,000
events/s, Stripe's own live limit, so sync is never the bottleneck.

    uv run python bench/stripe_sync.py [--rows 6000] [--customers 60] [--processes 2]
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg
import stripe

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.databases import fresh_database  # noqa: E402
from bench.docs_block import write_block  # noqa: E402
from bench.procs import free_port  # noqa: E402
from devtools.stripe_emulator.settings import NO_RATE_LIMITS  # noqa: E402
from metering.config import Settings  # noqa: E402
from metering.db import create_db_engine  # noqa: E402

DATABASE = "fairmeter_bench_stripe"
START = "<!-- bench/stripe_sync.py: generated from here -->"
END = "<!-- bench/stripe_sync.py: generated up to here -->"
THREADS = 8


def seed_outbox(url: str, rows: int, customers: list[tuple[str, str]]) -> None:
    """Settled runs with pending outbox rows, written in bulk SQL (not what is measured)."""
    ended = datetime.now(UTC) - timedelta(hours=1)
    with psycopg.connect(url, autocommit=True) as db:
        db.execute("INSERT INTO tenants (id) VALUES ('acme')")
        for name, stripe_id in customers:
            db.execute(
                "INSERT INTO customers (tenant_id, id, stripe_customer_id) VALUES ('acme', %s, %s)",
                (name, stripe_id),
            )
        db.execute(
            """
            INSERT INTO runs (tenant_id, subject, customer_id, first_event_at, last_event_at,
                last_received_at, event_count, gross_micros, billed_micros)
            SELECT 'acme', 'run-' || g, 'c' || (g %% %(n)s), %(t)s, %(t)s, %(t)s, 1, 1000 + g,
                   1000 + g FROM generate_series(1, %(rows)s) g
            """,
            {"n": len(customers), "t": ended, "rows": rows},
        )
        db.execute(
            """
            INSERT INTO stripe_outbox (tenant_id, customer_id, run_id, decision_version,
                target_billed_micros, period, event_timestamp, status)
            SELECT tenant_id, customer_id, id, 1, billed_micros, %s, %s, 'pending' FROM runs
            """,
            (ended.strftime("%Y-%m"), ended),
        )


def bench_settings(db_url: str, emulator: str) -> Settings:
    """What both phases use: the pusher's settings, hence its Stripe client configuration."""
    return Settings(
        database_url=db_url,
        stripe_api_base=emulator,
        stripe_push_threads=THREADS,
        stripe_push_batch_size=500,
    )


def raw_worker(args: tuple[str, str, list[str], int]) -> tuple[int, float, float]:
    """(events, finished at, CPU seconds): one thread and one client per customer."""
    db_url, url, customer_ids, per_thread = args
    from metering.billing.gateway import build_client

    settings, started_cpu = bench_settings(db_url, url), time.process_time()

    def send(customer: str) -> int:
        client = build_client(settings)  # the pusher also keeps one client per thread
        for i in range(per_thread):
            client.v1.billing.meter_events.create(
                params={
                    "event_name": settings.stripe_meter_event_name,
                    "identifier": f"raw-{customer}-{i}",
                    "payload": {"stripe_customer_id": customer, "value": "1"},
                    "timestamp": int(time.time()) - 60,
                },
                options={"idempotency_key": f"bench-raw:{customer}:{i}"},
            )
        return per_thread

    with ThreadPoolExecutor(max_workers=len(customer_ids)) as pool:
        sent = sum(pool.map(send, customer_ids))
    return sent, time.time(), time.process_time() - started_cpu


def push_worker(args: tuple[str, str]) -> tuple[int, float, float, float]:
    """(rows, last delivery recorded at, CPU seconds, CPU seconds of its PostgreSQL backends)."""
    db_url, emulator = args
    from metering.billing.push import Pusher

    settings, started_cpu = bench_settings(db_url, emulator), time.process_time()
    engine = create_db_engine(settings)
    pusher, sent, idle, finished = Pusher(engine, settings), 0, 0, time.time()
    while idle < 3:
        report = pusher.push_due()
        sent += report.sent_rows
        idle = idle + 1 if report.sent_rows == 0 else 0
        if report.sent_rows == 0:
            time.sleep(0.1)
        else:
            finished = time.time()
    cpu = time.process_time() - started_cpu
    return sent, finished, cpu, backend_cpu_s(engine)


def backend_cpu_s(engine: Any) -> float:
    """CPU seconds of the PostgreSQL backends in this process's pool (they live as long)."""
    pids = []
    for _ in range(engine.pool.checkedin()):
        conn = engine.raw_connection()
        pids.append(conn.driver_connection.info.backend_pid)
    total = 0.0
    for pid in set(pids):
        with contextlib.suppress(psutil.Error):
            times = psutil.Process(pid).cpu_times()
            total += times.user + times.system
    return total


def process_cpu_s(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


@dataclass(frozen=True)
class Phase:
    events: int
    rate: float  # events per second, start to the last recorded event
    client_us: float  # CPU per event: the client processes (SDK, pusher)
    emulator_us: float
    postgres_us: float

    def cpu(self) -> str:
        parts = f"client {self.client_us:,.0f}, emulator {self.emulator_us:,.0f}"
        if self.postgres_us:
            parts += f", PostgreSQL {self.postgres_us:,.0f}"
        return f"CPU µs per event: {parts}"


def measure(pool: Any, worker: Any, jobs: list[Any], emulator_pid: int) -> Phase:
    """Run one phase on every pool process; the clock stops at the last event recorded."""
    emulator_before, started = process_cpu_s(emulator_pid), time.time()
    results = pool.map(worker, jobs)
    emulator_s = process_cpu_s(emulator_pid) - emulator_before
    events = sum(r[0] for r in results)
    elapsed = max(r[1] for r in results) - started
    postgres_s = sum(r[3] for r in results) if len(results[0]) > 3 else 0.0
    return Phase(
        events=events,
        rate=events / elapsed,
        client_us=sum(r[2] for r in results) / events * 1e6,
        emulator_us=emulator_s / events * 1e6,
        postgres_us=postgres_s / events * 1e6,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=6000)
    parser.add_argument("--customers", type=int, default=64)
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args()
    port = free_port()
    emulator = subprocess.Popen(
        [sys.executable, "-m", "devtools.stripe_emulator.cli", "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                httpx.get(f"{url}/_emulator/health", timeout=1).raise_for_status()
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        # The emulator's own ceiling is measured, not Stripe's: its rate limits stay out of it.
        httpx.post(f"{url}/_emulator/settings", json=NO_RATE_LIMITS, timeout=5).raise_for_status()
        client = stripe.StripeClient("sk_test_bench", base_addresses={"api": url})
        client.v1.billing.meters.create(
            params={
                "display_name": "bench",
                "event_name": "fairmeter_billed_micros",
                "default_aggregation": {"formula": "sum"},
                "customer_mapping": {"event_payload_key": "stripe_customer_id", "type": "by_id"},
                "value_settings": {"event_payload_key": "value"},
            }
        )
        ids = [
            client.v1.customers.create(params={"name": f"c{i}"}).id for i in range(args.customers)
        ]
        db_url = fresh_database(DATABASE)
        seed_outbox(db_url, args.rows, [(f"c{i}", cid) for i, cid in enumerate(ids)])
        per_process = [ids[p :: args.processes][:THREADS] for p in range(args.processes)]
        per_thread = args.rows // (args.processes * THREADS)
        raw_jobs = [(db_url, url, c, per_thread) for c in per_process]
        with multiprocessing.get_context("spawn").Pool(args.processes) as pool:
            pool.map(abs, range(args.processes))  # both phases start with warm processes
            raw = measure(pool, raw_worker, raw_jobs, emulator.pid)
            push = measure(pool, push_worker, [(db_url, url)] * args.processes, emulator.pid)
    finally:
        emulator.terminate()
        emulator.wait(timeout=10)
    ratio = push.rate / raw.rate
    print(f"(a) SDK → emulator: {raw.rate:,.0f} events/s ({raw.events} events); {raw.cpu()}")
    print(
        f"(b) outbox pusher → emulator: {push.rate:,.0f} rows/s ({push.events} rows); {push.cpu()}"
    )
    print(
        f"(b)/(a) = {ratio:.2f}; target (b) ≥ 1,000/s: {'met' if push.rate >= 1000 else 'MISSED'}"
    )
    print(f"load average (1 min) after the run: {os.getloadavg()[0]:.2f}")
    write_report(args, raw, push, ratio)


def write_report(args: argparse.Namespace, raw: Phase, push: Phase, ratio: float) -> None:
    def cpu(phase: Phase) -> str:
        db = f"{phase.postgres_us:,.0f}" if phase.postgres_us else "—"
        return f"{phase.client_us:,.0f} / {phase.emulator_us:,.0f} / {db}"

    section = "\n".join(
        [
            START,
            "## Stripe sync",
            "",
            f"Command: `uv run python bench/stripe_sync.py --rows {args.rows} --customers "
            f"{args.customers} --processes {args.processes}` — {datetime.now(UTC):%Y-%m-%d %H:%M}"
            " UTC, 2 shared cores (emulator, PostgreSQL and the clients share them); load "
            f"average (1 min) after the run: {os.getloadavg()[0]:.2f}.",
            "",
            "| measurement | rate | ratio | CPU µs per event: clients / emulator / PostgreSQL "
            "| target |",
            "|---|---|---|---|---|",
            f"| (a) official SDK → emulator, {args.processes} processes × {THREADS} threads, "
            f"no database | {raw.rate:,.0f} events/s | 1.00 | {cpu(raw)} | — |",
            f"| (b) outbox pusher (claim, plan, call, record) → emulator, same processes | "
            f"{push.rate:,.0f} rows/s | {ratio:.2f} | {cpu(push)} | ≥ 1,000/s: "
            f"{'met' if push.rate >= 1000 else 'missed'} |",
            "",
            "Each row is one meter event; the pusher keeps one call in flight per customer "
            "(Stripe's rule) and records every delivery in PostgreSQL. Both phases use the "
            "pusher's own Stripe client (`build_client`) and send idempotency keys.",
            END,
        ]
    )
    write_block(ROOT / "docs" / "benchmarks.md", START, END, section)


if __name__ == "__main__":
    main()
