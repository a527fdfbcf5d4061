"""Benchmark: the JSON statement of a customer with 100,000 runs in the month.

Measures, in one run: (a) the raw baseline — one aggregate over the customer's statement
lines in SQL; (b) the statement through HTTP (first page + totals), server time measured by
the client on loopback. Prints the ratio and writes it, with the EXPLAIN of the main
queries, into docs/benchmarks.md. Target (issue #5): (b) < 1 s.

    uv run python bench/statement.py [--runs 100000] [--rounds 15]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.databases import fresh_database  # noqa: E402
from bench.docs_block import write_block  # noqa: E402
from bench.procs import free_port, wait_http  # noqa: E402
from devtools.bulk import settled_runs  # noqa: E402
from metering.keys import Scope  # noqa: E402
from metering.keys_repo import create_key  # noqa: E402
from metering.statements.query import LINE_SELECT  # noqa: E402

DATABASE = "fairmeter_bench_statement"
START = "<!-- bench/statement.py: generated from here -->"
END = "<!-- bench/statement.py: generated up to here -->"
PEPPER = "bench-pepper-0123456789abcdef0123456789abcdef"  # served processes need 32+ bytes


def timed(fn, rounds: int) -> list[float]:  # type: ignore[no-untyped-def]
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    url = fresh_database(DATABASE)
    with psycopg.connect(url, autocommit=True) as db:
        settled_runs(db, tenant="acme", customer="big", count=args.runs, period="2026-11")
        db.execute("ANALYZE")
        _, key = create_key(db, tenant_id="acme", scope=Scope.SUPPORT, pepper=PEPPER)
        params = {
            "tenant": "acme",
            "customer": "big",
            "period": "2026-11",
            "outcome": None,
            "ended_from": None,
            "ended_to": None,
            "after_ended": None,
            "after_run": None,
            "limit": 101,
        }
        raw = timed(
            lambda: db.execute(
                "SELECT sum(billed_abs) FROM statement_lines WHERE tenant_id = 'acme' "
                "AND customer_id = 'big' AND statement_period = '2026-11'"
            ).fetchone(),
            args.rounds,
        )
        page_sql = LINE_SELECT + " ORDER BY l.ended_at, l.run_id LIMIT %(limit)s"
        plan = "\n".join(r[0] for r in db.execute("EXPLAIN ANALYZE " + page_sql, params))
    port = free_port()
    env = {
        "DATABASE_URL": url,
        "FAIRMETER_KEY_PEPPER": PEPPER,
        "FAIRMETER_LOG_LEVEL": "WARNING",
        "PATH": "/usr/bin:/bin",
    }
    server = subprocess.Popen(
        [sys.executable, "-m", "cli", "serve", "--port", str(port)], cwd=ROOT, env=env
    )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/healthz")
        with httpx.Client(base_url=base, headers={"authorization": f"Bearer {key}"}) as http:
            http.get("/v1/customers/big/statements/2026-11").raise_for_status()  # warm up
            served = timed(
                lambda: http.get("/v1/customers/big/statements/2026-11").raise_for_status(),
                args.rounds,
            )
    finally:
        server.terminate()
        server.wait(timeout=15)
    raw_ms, served_ms = statistics.median(raw) * 1000, statistics.median(served) * 1000
    p95 = sorted(served)[int(len(served) * 0.95) - 1] * 1000
    print(f"raw aggregate over {args.runs:,} lines: {raw_ms:.1f} ms (median)")
    print(f"JSON statement (page of 100 + totals): {served_ms:.1f} ms median, {p95:.1f} ms p95")
    print(
        f"ratio statement/raw: {served_ms / raw_ms:.2f}; target < 1000 ms: "
        f"{'met' if served_ms < 1000 else 'MISSED'}"
    )
    write_report(args, raw_ms, served_ms, p95, plan)


def write_report(
    args: argparse.Namespace, raw_ms: float, served_ms: float, p95: float, plan: str
) -> None:
    section = "\n".join(
        [
            START,
            "## Statement",
            "",
            f"Command: `uv run python bench/statement.py --runs {args.runs} --rounds {args.rounds}`"
            f" — {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, 2 shared cores.",
            "",
            "| measurement | median | ratio to raw | target |",
            "|---|---|---|---|",
            f"| (a) raw `sum()` over {args.runs:,} statement lines | {raw_ms:.1f} ms | 1.00 | — |",
            f"| (b) `GET …/statements/2026-11` (page + totals), loopback | {served_ms:.1f} ms "
            f"(p95 {p95:.1f} ms) | {served_ms / raw_ms:.2f} | < 1,000 ms: "
            f"{'met' if served_ms < 1000 else 'missed'} |",
            "",
            "The statement reads the `statement_lines` read model (one row per run and statement,",
            "kept by settlement); index `ix_statement_lines_page` on",
            "(tenant, customer, statement_period, ended_at, run_id) makes a page a range scan.",
            "Its totals read `statement_totals` (sums by kind, outcome and day, kept by settlement",
            "beside the lines since migration 0026), a few dozen rows: (a) is what they replaced.",
            "",
            "EXPLAIN ANALYZE of the page query:",
            "",
            "```",
            plan,
            "```",
            END,
        ]
    )
    write_block(ROOT / "docs" / "benchmarks.md", START, END, section)


if __name__ == "__main__":
    main()
