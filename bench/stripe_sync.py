"""Benchmark: outbox rows pushed to Stripe (the project's emulator) per second.

Measures, in one run: (a) the emulator's own ceiling — the official SDK creating meter events
directly from the same number of processes and threads, no database; (b) the real pusher
draining outbox rows of settled runs (claim, plan, call, record), in the same processes.
Prints (b)/(a) and writes the result into docs/benchmarks.md. Target (issue #4): (b) ≥ 1,000
events/s, Stripe's own live limit, so sync is never the bottleneck.

    uv run python bench/stripe_sync.py [--rows 6000] [--customers 60] [--processes 2]
"""

from __future__ import annotations

import argparse
import multiprocessing
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import psycopg
import stripe

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from metering.config import Settings  # noqa: E402
from metering.db import create_db_engine  # noqa: E402
from metering.migrate import upgrade  # noqa: E402
from tests.conftest import free_port  # noqa: E402

SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"
DATABASE = "fairmeter_bench_stripe"
START = "<!-- bench/stripe_sync.py: generated from here -->"
END = "<!-- bench/stripe_sync.py: generated up to here -->"
THREADS = 8


def fresh_database() -> str:
    with psycopg.connect(SERVER, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DATABASE}")
    url = SERVER.rsplit("/", 1)[0] + f"/{DATABASE}"
    upgrade(url)
    return url


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


def raw_worker(args: tuple[str, list[str], int]) -> int:
    url, customer_ids, per_thread = args
    client = stripe.StripeClient(
        "sk_test_bench", base_addresses={"api": url}, max_network_retries=0
    )

    def send(customer: str) -> int:
        for i in range(per_thread):
            client.v1.billing.meter_events.create(
                params={
                    "event_name": "fairmeter_billed_micros",
                    "identifier": f"raw-{customer}-{i}",
                    "payload": {"stripe_customer_id": customer, "value": "1"},
                    "timestamp": int(time.time()) - 60,
                }
            )
        return per_thread

    with ThreadPoolExecutor(max_workers=len(customer_ids)) as pool:
        return sum(pool.map(send, customer_ids))


def push_worker(args: tuple[str, str]) -> int:
    db_url, emulator = args
    from metering.billing.push import Pusher

    settings = Settings(
        database_url=db_url,
        stripe_api_base=emulator,
        stripe_push_threads=THREADS,
        stripe_push_batch_size=500,
    )
    engine = create_db_engine(settings)
    pusher, sent, idle = Pusher(engine, settings), 0, 0
    while idle < 3:
        report = pusher.push_due()
        sent += report.sent_rows
        idle = idle + 1 if report.sent_rows == 0 else 0
        if report.sent_rows == 0:
            time.sleep(0.1)
    return sent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=6000)
    parser.add_argument("--customers", type=int, default=64)
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args()
    port = free_port()
    emulator = subprocess.Popen(
        [sys.executable, "-m", "api.stripe_emulator.cli", "--port", str(port)],
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
        db_url = fresh_database()
        seed_outbox(db_url, args.rows, [(f"c{i}", cid) for i, cid in enumerate(ids)])
        per_process = [ids[p :: args.processes][:THREADS] for p in range(args.processes)]
        per_thread = args.rows // (args.processes * THREADS)
        with multiprocessing.get_context("spawn").Pool(args.processes) as pool:
            started = time.perf_counter()
            raw_sent = sum(pool.map(raw_worker, [(url, c, per_thread) for c in per_process]))
            raw_rate = raw_sent / (time.perf_counter() - started)
            started = time.perf_counter()
            pushed = sum(pool.map(push_worker, [(db_url, url)] * args.processes))
            push_rate = pushed / (time.perf_counter() - started - 0.3)
    finally:
        emulator.terminate()
        emulator.wait(timeout=10)
    ratio = push_rate / raw_rate
    print(f"(a) raw SDK → emulator: {raw_rate:,.0f} events/s ({raw_sent} events)")
    print(f"(b) outbox pusher → emulator: {push_rate:,.0f} rows/s ({pushed} rows)")
    print(
        f"(b)/(a) = {ratio:.2f}; target (b) ≥ 1,000/s: {'met' if push_rate >= 1000 else 'MISSED'}"
    )
    write_report(args, raw_rate, push_rate, ratio)


def write_report(args: argparse.Namespace, raw: float, push: float, ratio: float) -> None:
    section = "\n".join(
        [
            START,
            "## Stripe sync",
            "",
            f"Command: `uv run python bench/stripe_sync.py --rows {args.rows} --customers "
            f"{args.customers} --processes {args.processes}` — {datetime.now(UTC):%Y-%m-%d %H:%M}"
            " UTC, 2 shared cores (emulator, PostgreSQL and the clients share them).",
            "",
            "| measurement | rate | ratio | target |",
            "|---|---|---|---|",
            f"| (a) official SDK → emulator, {args.processes} processes × {THREADS} threads, "
            f"no database | {raw:,.0f} events/s | 1.00 | — |",
            f"| (b) outbox pusher (claim, plan, call, record) → emulator, same processes | "
            f"{push:,.0f} rows/s | {ratio:.2f} | ≥ 1,000/s: "
            f"{'met' if push >= 1000 else 'missed'} |",
            "",
            "Each row is one meter event; the pusher keeps one call in flight per customer "
            "(Stripe's rule) and records every delivery in PostgreSQL.",
            END,
        ]
    )
    doc = ROOT / "docs" / "benchmarks.md"
    text = doc.read_text() if doc.exists() else "# Benchmarks\n"
    if START in text and END in text:
        text = text[: text.index(START)] + section + text[text.index(END) + len(END) :]
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    doc.write_text(text)


if __name__ == "__main__":
    main()
