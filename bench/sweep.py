"""Benchmark: what one settlement sweep costs PostgreSQL while many runs are in flight.

Beat sweeps every second. A sweep parks poison runs and claims the due runs; its cost
should follow the due runs, not the runs still going. The database (its own,
``fairmeter_bench_sweep``) holds ``--in-flight`` pending runs that are not due (events in
the last 30 minutes, no terminal event) and ``--due`` runs that completed 10 minutes ago.
Measured in one run, each sweep rolled back, median of ``--rounds``:

(a) raw baseline: one ``UPDATE`` that claims exactly the due runs by primary key — the
    work a claim cannot avoid;
(b) the sweep as the worker runs it (``park_poison_runs`` + ``claim_due_runs``);
(c) the same with nothing due (the state most sweeps find);
(d), (e): (b) and (c) with the previous queries, which evaluated every pending run's due
    time (``LEAST(...) <= now``) and found poison runs by reading all pending runs.

It prints the ratios (b)/(a), (d)/(b) and (e)/(c) and writes them into docs/benchmarks.md.

    uv run python bench/sweep.py [--in-flight 200000] [--due 2000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.databases import fresh_database  # noqa: E402
from bench.docs_block import write_block  # noqa: E402
from metering.db import SESSION_OPTIONS  # noqa: E402
from metering.settlement.due import Windows, claim_due_runs, park_poison_runs  # noqa: E402

DATABASE = "fairmeter_bench_sweep"
START = "<!-- bench/sweep.py: generated from here -->"
END = "<!-- bench/sweep.py: generated up to here -->"
WINDOWS = Windows(timedelta(seconds=120), timedelta(seconds=900), timedelta(seconds=3600))
LEASE = timedelta(minutes=2)
CUSTOMERS = 2000

# The claim as it was before the sweep indexes (migration 0009), for (d).
PREVIOUS_PARK = """
SELECT id FROM runs
WHERE settled_evidence_version < evidence_version AND parked_at IS NULL
  AND settle_attempts + 0 >= %(max_attempts)s
  AND (claimed_until IS NULL OR claimed_until < %(now)s)
"""
PREVIOUS_CLAIM = """
WITH due AS (
    SELECT id FROM runs
    WHERE settled_evidence_version < evidence_version AND parked_at IS NULL
      AND (claimed_until IS NULL OR claimed_until < %(now)s)
      AND LEAST(
            runs.last_event_at + %(idle)s,
            runs.terminal_at + %(grace)s,
            CASE WHEN runs.last_lost_at IS NOT NULL AND (runs.last_recovered_at IS NULL
                      OR runs.last_recovered_at < runs.last_lost_at)
                 THEN runs.last_lost_at + %(resume)s END) <= %(now)s
      AND (tenant_id, customer_id) NOT IN (
          SELECT tenant_id, customer_id FROM runs
          WHERE settled_evidence_version < evidence_version AND parked_at IS NULL
            AND claimed_until >= %(now)s)
    ORDER BY COALESCE(terminal_at, last_event_at), id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE runs SET claimed_until = %(lease_until)s, settle_attempts = settle_attempts + 1
FROM due WHERE runs.id = due.id
RETURNING runs.id
"""
RAW_CLAIM = """
UPDATE runs SET claimed_until = %(lease_until)s, settle_attempts = settle_attempts + 1
WHERE id = ANY(%(ids)s)
"""


def load(url: str, now: datetime, in_flight: int, due: int) -> list[int]:
    """Pending runs in flight (not due) and due runs; returns the due runs' ids."""
    params = {"now": now, "in_flight": in_flight, "due": due, "customers": CUSTOMERS}
    with psycopg.connect(url) as conn:
        conn.execute("INSERT INTO tenants (id) VALUES ('t')")
        conn.execute(
            "INSERT INTO customers (tenant_id, id) "
            "SELECT 't', 'c' || g FROM generate_series(1, %(customers)s) g",
            params,
        )
        conn.execute(
            "INSERT INTO runs (tenant_id, subject, customer_id, first_event_at, last_event_at,"
            " last_received_at, event_count, evidence_version) "
            "SELECT 't', 'live-' || g, 'c' || (g %% %(customers)s + 1), "
            "%(now)s - interval '40 min', %(now)s - (g %% 1800) * interval '1 s', %(now)s, 5, 5 "
            "FROM generate_series(1, %(in_flight)s) g",
            params,
        )
        rows = conn.execute(
            "INSERT INTO runs (tenant_id, subject, customer_id, first_event_at, last_event_at,"
            " last_received_at, event_count, evidence_version, terminal_at) "
            "SELECT 't', 'done-' || g, 'c' || (g %% %(customers)s + 1), "
            "%(now)s - interval '40 min', %(now)s - interval '10 min', %(now)s, 5, 5, "
            "%(now)s - interval '10 min' FROM generate_series(1, %(due)s) g RETURNING id",
            params,
        ).fetchall()
        conn.commit()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE runs")
    return [int(r[0]) for r in rows]


def backend_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/schedstat") as f:  # the backend runs on this machine
        return int(f.read().split()[0]) / 1e9


def measure(
    conn: psycopg.Connection[Any], step: Callable[[], int], rounds: int
) -> dict[str, float]:
    """Median wall and backend CPU of ``step`` (rolled back each time) and its row count."""
    pid = conn.info.backend_pid
    walls, cpus, counts = [], [], []
    for _ in range(rounds + 1):  # the first round warms caches and plans
        cpu, started = backend_cpu_s(pid), time.perf_counter()
        counts.append(step())
        walls.append(time.perf_counter() - started)
        cpus.append(backend_cpu_s(pid) - cpu)
        conn.rollback()
    return {
        "wall_ms": statistics.median(walls[1:]) * 1000,
        "cpu_ms": statistics.median(cpus[1:]) * 1000,
        "rows": counts[-1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--in-flight", type=int, default=200_000)
    parser.add_argument("--due", type=int, default=2_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--no-docs", action="store_true")
    args = parser.parse_args()
    url = fresh_database(DATABASE)
    now = datetime.now(UTC)
    print(f"loading {args.in_flight:,} runs in flight and {args.due:,} due …", flush=True)
    due_ids = load(url, now, args.in_flight, args.due)
    base = {
        "now": now,
        "lease_until": now + LEASE,
        "limit": 5000,
        "max_attempts": 5,
        "idle": WINDOWS.idle_timeout,
        "grace": WINDOWS.settle_grace,
        "resume": WINDOWS.resume_window,
    }

    with psycopg.connect(url, options=SESSION_OPTIONS) as conn:

        def raw() -> int:
            return conn.execute(RAW_CLAIM, {**base, "ids": due_ids}).rowcount

        def sweep(at: datetime) -> Callable[[], int]:
            def run() -> int:
                park_poison_runs(conn, at, 5)
                return len(claim_due_runs(conn, at, WINDOWS, limit=5000, lease=LEASE))

            return run

        def previous(at: datetime) -> Callable[[], int]:
            def run() -> int:
                params = {**base, "now": at}
                conn.execute(PREVIOUS_PARK, params).fetchall()
                return len(conn.execute(PREVIOUS_CLAIM, params).fetchall())

            return run

        results = {
            "a": measure(conn, raw, args.rounds),
            "b": measure(conn, sweep(now), args.rounds),
            "c": measure(conn, sweep(now - timedelta(minutes=9)), args.rounds),
            "d": measure(conn, previous(now), args.rounds),
            "e": measure(conn, previous(now - timedelta(minutes=9)), args.rounds),
        }
    labels = {
        "a": f"(a) raw UPDATE of the {args.due:,} due runs by id",
        "b": "(b) sweep: park + claim",
        "c": "(c) sweep with nothing due",
        "d": "(d) (b) with the previous queries",
        "e": "(e) (c) with the previous queries",
    }
    for key, label in labels.items():
        r = results[key]
        print(
            f"{label:48s} {r['wall_ms']:8.1f} ms wall {r['cpu_ms']:8.1f} ms CPU  "
            f"{int(r['rows']):>6,} runs"
        )
    b_over_a = results["b"]["cpu_ms"] / results["a"]["cpu_ms"]
    d_over_b = results["d"]["cpu_ms"] / results["b"]["cpu_ms"]
    e_over_c = results["e"]["cpu_ms"] / results["c"]["cpu_ms"]
    print(
        f"(b)/(a) sweep vs raw claim, CPU: {b_over_a:.2f}; previous vs now: "
        f"(d)/(b) {d_over_b:.2f}, (e)/(c) {e_over_c:.0f}"
    )
    if not args.no_docs:
        write_report(args, results, labels, b_over_a, d_over_b, e_over_c)


def write_report(
    args: argparse.Namespace,
    results: dict[str, dict[str, float]],
    labels: dict[str, str],
    b_over_a: float,
    d_over_b: float,
    e_over_c: float,
) -> None:
    rows = [
        f"| {labels[k]} | {r['wall_ms']:.1f} ms | {r['cpu_ms']:.1f} ms | {int(r['rows']):,} |"
        for k, r in results.items()
    ]
    section = "\n".join(
        [
            START,
            f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC with `uv run --frozen python "
            f"bench/sweep.py --in-flight {args.in_flight} --due {args.due} --rounds "
            f"{args.rounds}`: {args.in_flight:,} runs in flight (not due), {args.due:,} due, "
            f"{CUSTOMERS:,} customers; median of {args.rounds} sweeps, each rolled back; CPU "
            "is the PostgreSQL backend's.",
            "",
            "| measurement | wall | PostgreSQL CPU | runs claimed |",
            "| --- | ---: | ---: | ---: |",
            *rows,
            "",
            f"(b)/(a): **{b_over_a:.2f}** (the sweep against the bare claim of the same runs); "
            f"previous queries against these: (d)/(b) **{d_over_b:.2f}**, (e)/(c) "
            f"**{e_over_c:.0f}**.",
            END,
        ]
    )
    doc = ROOT / "docs" / "benchmarks.md"
    write_block(doc, START, END, section, new_section="## Settlement sweeps")


if __name__ == "__main__":
    main()
