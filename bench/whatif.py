"""What-if benchmark: replaying a settled period under a candidate policy, against bare
``decide()`` over the same runs' facts in the same run.

On a database of its own (``fairmeter_bench_whatif``, dropped and re-created): loads the
settlement benchmark's workload (``bench/settle.py``: mixed, realistic runs of several
hundred customers) through the ingest use case and settles it in this process (neither is
measured); then times

1. bare ``decide()`` over every run's facts already in memory, on one core (no reads, one
   decision per run, with its explanation as settlement makes it), best of ``--rounds``;
2. the what-if replay under a candidate (R8 off, R4 off) as the API runs it
   (``replay_period_parallel``, ``--processes`` processes, one snapshot): it streams the
   period's runs in batches, reads their facts, decides each under the candidate and a
   sample under its own policy, best of ``--rounds``, with each process's peak RSS.

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
from bench.docs_block import write_block  # noqa: E402
from metering.config import Settings  # noqa: E402
from metering.db import SESSION_OPTIONS, create_db_engine  # noqa: E402
from metering.keys_repo import ensure_tenant  # noqa: E402
from metering.migrate import upgrade  # noqa: E402
from metering.policies.defaults import settings_policy  # noqa: E402
from metering.policy import RunFacts, decide  # noqa: E402
from metering.policy.document import parse_policy  # noqa: E402
from metering.prices import (  # noqa: E402
    PROVIDER_COSTS,
    insert_prices,
    load_catalog,
    read_catalog_file,
)
from metering.settlement import replay, replay_pool  # noqa: E402
from metering.settlement.decided_facts import decode_decided_facts  # noqa: E402
from metering.settlement.replay import WhatIf  # noqa: E402
from metering.settlement.replay_shards import Parallelism, replay_period_parallel  # noqa: E402
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
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--customers", type=int, default=4_000)
    parser.add_argument(
        "--processes", type=int, default=os.cpu_count() or 1, help="replay processes"
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--loaders", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--docs", type=Path, default=ROOT / "docs" / "benchmarks.md")
    parser.add_argument("--no-docs", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    parser.add_argument(
        "--reuse", action="store_true", help="measure on the database a --keep run left"
    )
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
    """Peak RSS of this process."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def replay_rate(url: str, rounds: int, processes: int) -> dict[str, Any]:
    settings = Settings(database_url=url)
    defaults = settings_policy(settings)
    candidate = parse_policy(CANDIDATE, defaults=defaults)
    parallelism = Parallelism(settings.libpq_url(), processes)
    with psycopg.connect(url) as conn:
        periods = [r[0] for r in conn.execute("SELECT DISTINCT period FROM runs").fetchall()]
    best, report = float("inf"), None
    for _ in range(rounds):
        started = time.perf_counter()
        reports = []
        with psycopg.connect(url, options=SESSION_OPTIONS) as conn:
            for period in periods:
                reports.append(
                    replay_period_parallel(
                        conn, base.TENANT, period, candidate, defaults, parallelism
                    )
                )
                conn.rollback()
        best = min(best, time.perf_counter() - started)
        report = reports
    assert report is not None
    runs = sum(r.runs for r in report)
    return {
        "runs": runs,
        "checked": sum(r.checked for r in report),
        "reproduced": sum(r.reproduced for r in report),
        "seconds": best,
        "rate": runs / best,
        "changes": {f"{o} → {n}": c.runs for r in report for (o, n), c in r.changes.items()},
        "rss_mb": [rss_mb(), *worker_peaks_mb()],
        "processes": processes,
    }


def worker_peaks_mb() -> list[float]:
    """Peak RSS of the replay's worker processes (VmHWM), while they are alive."""
    peaks = []
    for pid in replay_pool.POOL.worker_pids():
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                peaks.append(int(line.split()[1]) / 1024)
    return peaks


def phases(url: str) -> dict[str, tuple[float, float]]:
    """Where one process's replay time goes, phase by phase, over the whole period: (wall,
    CPU of this process) seconds. Wall minus CPU of a query is mostly PostgreSQL's work.
    The collector is paused, as in the replay."""
    spent: dict[str, list[float]] = {}
    clock = [time.perf_counter(), time.process_time()]

    def lap(name: str) -> None:
        wall, cpu = time.perf_counter(), time.process_time()
        totals = spent.setdefault(name, [0.0, 0.0])
        totals[0] += wall - clock[0]
        totals[1] += cpu - clock[1]
        clock[:] = [wall, cpu]

    settings = Settings(database_url=url)
    config = parse_policy(CANDIDATE, defaults=settings_policy(settings)).config()
    with replay.collector_paused(), psycopg.connect(url, options=SESSION_OPTIONS) as conn:
        costs = load_catalog(conn, PROVIDER_COSTS)
        for (period,) in conn.execute("SELECT DISTINCT period FROM runs").fetchall():
            clock[:] = [time.perf_counter(), time.process_time()]
            for batch in replay._runs(conn, base.TENANT, period, replay.Shard()):
                lap("runs, decisions and their facts records: read")
                decided = [decode_decided_facts(run.facts) for run in batch]
                lap("facts records: decoded")
                unrecorded = sum(facts is None for facts in decided)
                if unrecorded:
                    raise SystemExit(f"{unrecorded} decisions kept no facts record: reload")
                for facts in decided:
                    assert facts is not None
                    for line, (model, inp, cached, out) in zip(
                        facts.usage, facts.pricing, strict=True
                    ):
                        costs.total_micros(model, inp, cached, out, line.time)
                lap("usage lines: provider cost")
                for run, facts in zip(batch, decided, strict=True):
                    assert facts is not None
                    run_facts = RunFacts(facts.events, facts.usage, run.abandoned)
                    decide(run_facts, config, explained=False)
                lap("decide (candidate, no words)")
    return {name: (wall, cpu) for name, (wall, cpu) in spent.items()}


def decide_rate(url: str, rounds: int) -> dict[str, Any]:
    """Bare ``decide()`` over the period's facts, read once into memory the way the replay
    reads them, under the candidate, on one core."""
    settings = Settings(database_url=url)
    config = parse_policy(CANDIDATE, defaults=settings_policy(settings)).config()
    facts: list[RunFacts] = []
    with psycopg.connect(url, options=SESSION_OPTIONS) as conn:
        costs = load_catalog(conn, PROVIDER_COSTS)
        for (period,) in conn.execute("SELECT DISTINCT period FROM runs").fetchall():
            report = WhatIf(period, parse_policy(CANDIDATE, defaults=settings_policy(settings)))
            for batch in replay._runs(conn, base.TENANT, period, replay.Shard()):
                ids = [run.run_id for run in batch]
                read = replay._facts(conn, batch, set(ids), costs, report)
                facts.extend(
                    RunFacts(
                        tuple(read.events.get(run.run_id, ())),
                        tuple(read.usage.get(run.run_id, ())),
                        run.abandoned,
                    )
                    for run in batch
                )
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        for f in facts:
            decide(f, config)
        best = min(best, time.perf_counter() - started)
    return {"runs": len(facts), "seconds": best, "rate": len(facts) / best}


def main() -> None:
    args = parse_args()
    if args.reuse:
        url = base.with_database(args.database_url, DATABASE)
        with psycopg.connect(url) as conn:
            stored = conn.execute("SELECT count(*) FROM events").fetchone()[0]  # type: ignore[index]
        load_s = settle_s = 0.0
    else:
        url = prepare(args.database_url)
    load_before = os.getloadavg()
    try:
        if not args.reuse:
            stored, load_s = base.load(url, args)
            engine = create_db_engine(Settings(database_url=url))
            settled_at = time.perf_counter()
            settle_due_now(
                engine, Settings(database_url=url), now=datetime.now(UTC) + timedelta(days=1)
            )
            settle_s = time.perf_counter() - settled_at
            engine.dispose()
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("VACUUM ANALYZE")  # as autovacuum would have, given the time
        policy = decide_rate(url, args.rounds)
        replay = replay_rate(url, args.rounds, args.processes)
        split = phases(url)
    finally:
        if not args.keep:
            drop(args.database_url)
    results = {
        "args": args,
        "events": stored,
        "load_s": load_s,
        "settle_s": settle_s,
        "policy": policy,
        "replay": replay,
        "phases": split,
        "load": (load_before, os.getloadavg()),
    }
    print(render(results))
    if replay["reproduced"] != replay["checked"]:
        sys.exit(f"replay reproduced {replay['reproduced']} of {replay['checked']} checked")
    if not args.no_docs:
        write_docs(args.docs, render(results))


def render(r: dict[str, Any]) -> str:
    args, policy, replay = r["args"], r["policy"], r["replay"]
    (before, after), when = r["load"], datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    per_run_s = replay["seconds"] / max(replay["runs"], 1)
    return "\n".join(
        [
            f"Measured {when} with `uv run --frozen python bench/whatif.py --runs {args.runs}"
            + (" --reuse" if args.reuse else "")
            + "`.",
            "",
            f"- Machine: {os.cpu_count()} × {platform.processor() or platform.machine()}, "
            f"load average before / after: {' '.join(f'{x:.2f}' for x in before)} / "
            f"{' '.join(f'{x:.2f}' for x in after)}.",
            f"- Workload: {args.runs:,} settled runs, {r['events']:,} events, "
            f"{args.customers} customers (bench/settle.py's shapes); "
            + (
                "the database an earlier `--keep` run loaded and settled."
                if args.reuse
                else f"loaded in {r['load_s']:.0f} s and settled in-process in "
                f"{r['settle_s']:.0f} s (not measured)."
            ),
            f"- Candidate: `{CANDIDATE}`.",
            "",
            "| measurement | result | detail |",
            "| --- | ---: | --- |",
            f"| bare `decide()`, facts in memory, 1 core | {policy['rate']:,.0f} decisions/s | "
            f"{policy['seconds']:.2f} s for {policy['runs']:,} runs, best of {args.rounds} |",
            f"| what-if replay, {replay['processes']} processes | {replay['rate']:,.0f} runs/s "
            f"| {replay['seconds']:.2f} s for {replay['runs']:,} runs (reads, candidate "
            f"decision, sample checked), best of {args.rounds} |",
            f"| ratio replay / bare | {replay['rate'] / policy['rate']:.2f} | "
            "runs/s ÷ decisions/s |",
            f"| 100,000 runs | {per_run_s * 100_000:.1f} s | "
            + ("measured" if replay["runs"] == 100_000 else "at this rate, not measured")
            + " (issue #17 asks < 10 s) |",
            f"| peak RSS per process | {' / '.join(f'{mb:.0f}' for mb in replay['rss_mb'])} MB "
            "| the caller (which also held the bare run's facts) / each worker |",
            f"| checked | {replay['reproduced']:,} of {replay['checked']:,} reproduced | "
            "sampled runs also replayed under their own policy, equal to the stored decision |",
            "",
            f"Outcome changes under the candidate: `{replay['changes']}`.",
            "",
            "Where one process's time goes (the whole period in one process, collector "
            "paused; wall minus CPU of a read is mostly PostgreSQL's work):",
            "",
            "| phase | wall s | CPU s of the process |",
            "| --- | ---: | ---: |",
            *(f"| {name} | {wall:.2f} | {cpu:.2f} |" for name, (wall, cpu) in r["phases"].items()),
            f"| all | {sum(w for w, _ in r['phases'].values()):.2f} | "
            f"{sum(c for _, c in r['phases'].values()):.2f} |",
        ]
    )


def write_docs(path: Path, section: str) -> None:
    write_block(
        path,
        START,
        END,
        f"{START}\n{section}\n{END}",
        new_section="## What-if replay\n\n`bench/whatif.py` (issue #17): the replay of a settled "
        "period under a candidate policy, against bare `decide()` in the same run.",
    )


if __name__ == "__main__":
    main()
