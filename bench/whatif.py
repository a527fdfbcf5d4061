"""What-if benchmark: replaying a settled period under a candidate policy, against bare
``decide()`` over the same runs' facts in the same run.

On a database of its own (``fairmeter_bench_whatif``, dropped and re-created): loads the
settlement benchmark's workload (``bench/settle.py``: mixed, realistic runs of several
hundred customers) through the ingest use case and settles it in this process (neither is
measured); then times

1. ``decide()`` over every run's facts already in memory (the ceiling: no reads, one
   decision per run), best of ``--rounds``;
2. ``replay_period`` under a candidate (R8 off, R4 off): it streams the period's runs in
   batches, reads their facts and decides each twice (own policy and candidate), best of
   ``--rounds``, with the process's peak RSS before and after.

It checks that every stored decision is reproduced, prints the rates and their ratio, and
writes the "What-if replay" section of docs/benchmarks.md. The database is dropped before
it returns.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import settle as base  # noqa: E402
from metering.config import Settings  # noqa: E402
from metering.db import SESSION_OPTIONS, create_db_engine  # noqa: E402
from metering.keys_repo import ensure_tenant  # noqa: E402
from metering.migrate import upgrade  # noqa: E402
from metering.policies.defaults import settings_policy  # noqa: E402
from metering.policy.document import parse_policy  # noqa: E402
from metering.prices import PROVIDER_COSTS, insert_prices, read_catalog_file  # noqa: E402
from metering.settlement.replay import replay_period  # noqa: E402
from metering.settlement.runner import settle_due_now  # noqa: E402

DATABASE = "fairmeter_bench_whatif"
START = "<!-- bench/whatif.py: generated from here -->"
END = "<!-- bench/whatif.py: generated up to here -->"
CANDIDATE = {"rules": {"R8": False, "R4": False}}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--database-url", default=os.environ.get("DATABASE_URL", base.LOCAL_DATABASE_URL)
    )
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--customers", type=int, default=400)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--loaders", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--docs", type=Path, default=ROOT / "docs" / "benchmarks.md")
    parser.add_argument("--no-docs", action="store_true")
    return parser.parse_args()


def prepare(server_url: str) -> str:
    url = base.with_database(server_url, DATABASE)
    drop(server_url)
    with psycopg.connect(base.with_database(server_url, "postgres"), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{DATABASE}"')
    upgrade(url)
    with psycopg.connect(url) as conn:
        insert_prices(conn, read_catalog_file())
        costs = read_catalog_file(kind=PROVIDER_COSTS)
        insert_prices(conn, costs, PROVIDER_COSTS)
        ensure_tenant(conn, base.TENANT)
    return url


def drop(server_url: str) -> None:
    with psycopg.connect(base.with_database(server_url, "postgres"), autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
            (DATABASE,),
        )
        conn.execute(f'DROP DATABASE IF EXISTS "{DATABASE}"')


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def replay_rate(url: str, rounds: int) -> dict[str, Any]:
    settings = Settings(database_url=url)
    defaults = settings_policy(settings)
    candidate = parse_policy(CANDIDATE, defaults=defaults)
    with psycopg.connect(url) as conn:
        periods = [r[0] for r in conn.execute("SELECT DISTINCT period FROM runs").fetchall()]
    best, report, before = float("inf"), None, rss_mb()
    for _ in range(rounds):
        started = time.perf_counter()
        reports = []
        with psycopg.connect(url, options=SESSION_OPTIONS) as conn:
            for period in periods:
                reports.append(replay_period(conn, base.TENANT, period, candidate, defaults))
                conn.rollback()
        best = min(best, time.perf_counter() - started)
        report = reports
    assert report is not None
    runs = sum(r.runs for r in report)
    return {
        "runs": runs,
        "reproduced": sum(r.reproduced for r in report),
        "seconds": best,
        "rate": runs / best,
        "changes": {f"{o} → {n}": c.runs for r in report for (o, n), c in r.changes.items()},
        "rss_before_mb": before,
        "rss_after_mb": rss_mb(),
    }


def main() -> None:
    args = parse_args()
    url = prepare(args.database_url)
    load_before = os.getloadavg()
    try:
        stored, load_s = base.load(url, args)
        engine = create_db_engine(Settings(database_url=url))
        settled_at = time.perf_counter()
        settle_due_now(
            engine, Settings(database_url=url), now=datetime.now(UTC) + timedelta(days=1)
        )
        settle_s = time.perf_counter() - settled_at
        engine.dispose()
        policy = base.policy_rate(url, args.rounds)
        replay = replay_rate(url, args.rounds)
    finally:
        drop(args.database_url)
    results = {
        "args": args,
        "events": stored,
        "load_s": load_s,
        "settle_s": settle_s,
        "policy": policy,
        "replay": replay,
        "load": (load_before, os.getloadavg()),
    }
    print(render(results))
    if replay["reproduced"] != replay["runs"]:
        sys.exit(f"replay reproduced {replay['reproduced']} of {replay['runs']} decisions")
    if not args.no_docs:
        write_docs(args.docs, render(results))


def render(r: dict[str, Any]) -> str:
    args, policy, replay = r["args"], r["policy"], r["replay"]
    (before, after), when = r["load"], datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    per_run_s = replay["seconds"] / max(replay["runs"], 1)
    return "\n".join(
        [
            f"Measured {when} with `uv run --frozen python bench/whatif.py --runs {args.runs}`.",
            "",
            f"- Machine: {os.cpu_count()} × {platform.processor() or platform.machine()}, "
            f"load average before / after: {' '.join(f'{x:.2f}' for x in before)} / "
            f"{' '.join(f'{x:.2f}' for x in after)}.",
            f"- Workload: {args.runs:,} settled runs, {r['events']:,} events, "
            f"{args.customers} customers (bench/settle.py's shapes); loaded in "
            f"{r['load_s']:.0f} s and settled in-process in {r['settle_s']:.0f} s (not measured).",
            f"- Candidate: `{CANDIDATE}`.",
            "",
            "| measurement | result | detail |",
            "| --- | ---: | --- |",
            f"| pure `decide()`, facts in memory | {policy['rate']:,.0f} decisions/s | "
            f"{policy['seconds']:.2f} s for {policy['runs']:,} runs, best of {args.rounds} |",
            f"| what-if replay | {replay['rate']:,.0f} runs/s | {replay['seconds']:.2f} s for "
            f"{replay['runs']:,} runs (reads + 2 decisions each), best of {args.rounds} |",
            f"| ratio replay / pure | {replay['rate'] / policy['rate']:.2f} | "
            "runs/s ÷ decisions/s |",
            f"| 100,000 runs at this rate | {per_run_s * 100_000:.1f} s | estimate, not measured "
            "(issue #17 asks < 10 s) |",
            f"| peak RSS of the process | {replay['rss_before_mb']:.0f} → "
            f"{replay['rss_after_mb']:.0f} MB | before / after the replays (facts for the pure "
            "run were already in memory) |",
            f"| reproduced | {replay['reproduced']:,} of {replay['runs']:,} | "
            "stored decisions the replay under their own policy gave exactly |",
            "",
            f"Outcome changes under the candidate: `{replay['changes']}`.",
        ]
    )


def write_docs(path: Path, section: str) -> None:
    text = path.read_text()
    block = f"{START}\n{section}\n{END}"
    if START in text:
        head, rest = text.split(START, 1)
        text = head + block + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + (
            "\n\n## What-if replay\n\n`bench/whatif.py` (issue #17): the replay of a settled "
            "period under a candidate policy, against bare `decide()` in the same run.\n\n"
            f"{block}\n"
        )
    path.write_text(text)


if __name__ == "__main__":
    main()
