"""Ingest benchmark (``make bench``): Fairmeter's ingest against PostgreSQL and a bare app.

One run measures, on a database of its own (``fairmeter_bench``, dropped and re-created):

(a) raw PostgreSQL ``COPY`` of the ``events`` rows that (b) writes — the ceiling;
(b) batch ingest through HTTP, 1,000-event batches, events/s;
(c) single-event ingest at 32 keep-alive connections, requests/s with p50/p99;
(d) a bare Litestar endpoint doing one INSERT per request under the same load — the
    baseline for (c), driven by the same load generator at the same concurrency.

It prints the ratios (b)/(a) and (c)/(d) and rewrites the generated part of the "Ingest"
section of docs/benchmarks.md. Everything it starts is stopped before it returns.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import psycopg

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python bench/ingest.py` puts bench/, not the root, first
    sys.path.insert(0, str(ROOT))

from bench import report  # noqa: E402
from bench.loadgen import LoadResult, Target, run_bodies  # noqa: E402
from bench.procs import CpuMeter, Server, free_port, serve  # noqa: E402
from metering.ingest.validation import TimeWindow, validate_batch  # noqa: E402
from metering.keys import Scope  # noqa: E402
from metering.keys_repo import create_key  # noqa: E402
from metering.migrate import upgrade  # noqa: E402
from metering.prices import insert_prices, read_catalog_file  # noqa: E402
from metering.timestamps import canonical_time  # noqa: E402

BENCH_DATABASE = "fairmeter_bench"
LOCAL_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
LOCAL_REDIS_URL = "redis://127.0.0.1:6379/0"
PEPPER = "bench-pepper-0123456789abcdef0123456789abcdef"  # served processes need 32+ bytes
TENANT = "bench"
EVENTS_PER_RUN = 20  # run.started, 18 x run.usage, run.completed
CUSTOMERS = 16
WARM_BATCHES = 4


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL", LOCAL_DATABASE_URL),
        help="any database on the server to use; the bench creates its own beside it",
    )
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", LOCAL_REDIS_URL))
    parser.add_argument("--events", type=int, default=100_000, help="rows for (a) and (b)")
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--batch-connections", type=int, default=4)
    parser.add_argument("--connections", type=int, default=32, help="for (c) and (d)")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per (c)/(d) run")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds, before each run")
    parser.add_argument("--rounds", type=int, default=2, help="(d),(c) pairs; best kept")
    parser.add_argument("--workers", type=int, default=2, help="uvicorn workers per app")
    parser.add_argument(
        "--loadgen",
        choices=["python", "wrk", "auto"],
        default="python",
        help="for (c)/(d); auto: wrk when installed. wrk opens its connections at once and "
        "uvicorn lets one worker accept most of them, so python (which staggers) is the default",
    )
    parser.add_argument("--client-procs", type=int, default=1, help="python loadgen processes")
    parser.add_argument("--docs", type=Path, default=ROOT / "docs" / "benchmarks.md")
    parser.add_argument("--no-docs", action="store_true", help="print only")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument(
        "--api-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra environment for the API (e.g. FAIRMETER_DB_POOL_SIZE=32); repeatable",
    )
    return parser.parse_args(argv)


# --- the database ---------------------------------------------------------------------


def with_database(url: str, name: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    plain = url.replace("postgresql+psycopg://", "postgresql://", 1)
    return urlunsplit(urlsplit(plain)._replace(path=f"/{name}"))


def prepare_database(server_url: str, name: str = BENCH_DATABASE) -> tuple[str, str]:
    """Drop and re-create the bench database at head, with prices and an ingest key."""
    url = with_database(server_url, name)
    with psycopg.connect(with_database(server_url, "postgres"), autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            (name,),
        )
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    upgrade(url)
    from bench.baseline_app import TABLE_DDL

    with psycopg.connect(url) as conn:
        insert_prices(conn, read_catalog_file())
        conn.execute(TABLE_DDL)
        _, key = create_key(conn, tenant_id=TENANT, scope=Scope.INGEST, pepper=PEPPER)
    return url, key


def analyze(url: str) -> None:
    """Fresh planner statistics after a bulk load, as autovacuum gives a running system."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ANALYZE")


def count_events(url: str) -> dict[str, int]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT source, count(*) FROM events GROUP BY source").fetchall()
        bare = conn.execute("SELECT count(*) FROM bare_events").fetchone()
    counts = {str(source): int(n) for source, n in rows}
    counts["bare"] = int(bare[0]) if bare else 0
    return counts


# --- the workload ---------------------------------------------------------------------


def make_batches(count: int, size: int, now: datetime, tag: str) -> list[list[dict[str, Any]]]:
    """``count`` batches of ``size`` events; each run is 20 events in order, all new."""
    batches = []
    base = now - timedelta(minutes=5)
    for b in range(count):
        batch = []
        for i in range(size):
            run, step = divmod(i, EVENTS_PER_RUN)
            if step == 0:
                kind, data = "run.started", {}
            elif step == EVENTS_PER_RUN - 1:
                kind, data = "run.completed", {}
            else:
                kind = "run.usage"
                data = {
                    "step": step,
                    "model": "agent-large-1",
                    "input_tokens": 1000 + i,
                    "cached_input_tokens": 200,
                    "output_tokens": 300 + step,
                }
            batch.append(
                {
                    "specversion": "1.0",
                    "id": f"{tag}{b}-{i}",
                    "source": f"bench/{tag}",
                    "type": kind,
                    "subject": f"run-{tag}{b}-{run}",
                    "time": canonical_time(base + timedelta(milliseconds=step)),
                    "data": {"customer": f"cust-{run % CUSTOMERS}", **data},
                }
            )
        batches.append(batch)
    return batches


def bench_copy(
    url: str, batches: list[list[dict[str, Any]]], now: datetime, tenant: str
) -> dict[str, Any]:
    """(a): COPY the events rows batch ingest would write (validated, hashed) in one go."""
    window = TimeWindow(now=now, max_future=timedelta(minutes=5), max_age=timedelta(days=35))
    valid = [e for batch in batches for e in validate_batch(batch, window)[0]]
    with psycopg.connect(url) as conn:
        conn.execute("INSERT INTO tenants (id) VALUES (%s)", (tenant,))
        conn.execute(
            "INSERT INTO customers (tenant_id, id) SELECT %s, unnest(%s::text[])",
            (tenant, sorted({e.customer for e in valid})),
        )
        first = {e.subject: e for e in reversed(valid)}
        run_ids = dict(
            conn.execute(
                "INSERT INTO runs (tenant_id, subject, customer_id, first_event_at, "
                "last_event_at, last_received_at, event_count) "
                "SELECT %s, s, c, t, t, t, 0 FROM unnest(%s::text[], %s::text[], "
                "%s::timestamptz[]) AS u(s, c, t) RETURNING subject, id",
                (
                    tenant,
                    list(first),
                    [e.customer for e in first.values()],
                    [e.time for e in first.values()],
                ),
            ).fetchall()
        )
        conn.commit()
        encode = msgspec.json.encode
        rows = [
            (
                tenant,
                e.source,
                e.id,
                e.type,
                run_ids[e.subject],
                e.time,
                now,
                e.body_hash,
                encode(e.attributes).decode(),
                encode(e.data).decode(),
            )
            for e in valid
        ]
        started = time.perf_counter()
        with (
            conn.cursor() as cur,
            cur.copy(
                "COPY events (tenant_id, source, event_id, type, run_id, time, received_at, "
                "body_hash, attributes, data) FROM STDIN"
            ) as copy,
        ):
            for row in rows:
                copy.write_row(row)
        conn.commit()
        elapsed = time.perf_counter() - started
    return {"rows": len(rows), "elapsed_s": round(elapsed, 3), "rate": round(len(rows) / elapsed)}


def bench_batches(server: Server, key: str, bodies: list[bytes], connections: int) -> LoadResult:
    """(b): POST each 1,000-event batch once over a few keep-alive connections."""
    headers = {
        "Content-Type": "application/cloudevents-batch+json",
        "Authorization": f"Bearer {key}",
    }
    target = Target("127.0.0.1", server.port, "/v1/events", headers)
    return run_bodies(target, bodies, connections, [p.pid for p in server.workers()])


# --- the servers and the load generator -------------------------------------------------


def api_command(port: int, workers: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "cli",
        "serve",
        "--port",
        str(port),
        "--workers",
        str(workers),
    ]


def bare_command(port: int, workers: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "uvicorn",
        "bench.baseline_app:create_app",
        "--factory",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        str(workers),
        "--log-level",
        "warning",
        "--no-access-log",
    ]


def choose_loadgen(requested: str) -> str:
    if requested == "auto":
        return "wrk" if shutil.which("wrk") else "python"
    return requested


def load_command(
    opts: argparse.Namespace, tool: str, server: Server, key: str, prefix: str, seconds: float
) -> list[str]:
    when = canonical_time(datetime.now(UTC) - timedelta(seconds=1))
    if tool == "wrk":
        threads = min(2, opts.connections)
        runs = 50 * opts.connections // threads  # as many runs per connection as loadgen.py
        return [
            "wrk",
            f"-t{threads}",
            f"-c{opts.connections}",
            f"-d{max(1, round(seconds))}s",
            "-s",
            str(ROOT / "bench" / "single_event.lua"),
            f"http://127.0.0.1:{server.port}/v1/events",
            "--",
            key,
            prefix,
            when,
            str(runs),
        ]
    return [
        sys.executable,
        "-m",
        "bench.loadgen",
        "single",
        "--port",
        str(server.port),
        "--key",
        key,
        "--connections",
        str(opts.connections),
        "--duration",
        str(seconds),
        "--prefix",
        prefix,
        "--time",
        when,
        "--procs",
        str(opts.client_procs),
        "--workers",
        ",".join(str(p.pid) for p in server.workers()),
    ]


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_load(
    opts: argparse.Namespace, tool: str, server: Server, key: str, prefix: str, seconds: float
) -> dict[str, Any]:
    """One fixed-duration run of the single-event load, with the CPU it cost each side.

    CPU time per request (server processes, the database's backends, the load generator)
    does not depend on what else the shared machine is doing; requests/s does.
    """
    meter = CpuMeter(server, opts.database_url, BENCH_DATABASE)
    client_before = _children_cpu_s()
    cmd = load_command(opts, tool, server, key, prefix, seconds)
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    time.sleep(min(2.0, seconds / 2))
    spread = server.connections_per_worker()  # wrk's; the python loadgen reports its own
    out, err = proc.communicate(timeout=seconds + 120)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed ({proc.returncode}): {(out + err)[-3000:]}")
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    result["rate"] = round(result["requests"] / result["elapsed_s"], 1)
    client_s = result.get("client_cpu_s") or (_children_cpu_s() - client_before)
    client_ms = client_s * 1000 / max(1, result["requests"])
    result["cpu_ms"] = meter.per_unit_ms(result["requests"]) | {"client": round(client_ms, 3)}
    result["connections_per_worker"] = result.get("connections_per_worker") or spread
    result["new_db_sessions"] = meter.new_sessions()
    return result


def bench_single(
    opts: argparse.Namespace, tool: str, api: Server, bare: Server, key: str
) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """(c) and (d), alternated ``rounds`` times so both see the same machine noise."""
    rounds = []
    for n in range(opts.rounds):
        for side, server in (("bare", bare), ("fairmeter", api)):
            if opts.warmup > 0:
                run_load(opts, tool, server, key, f"w{n}{side[0]}", opts.warmup)
            result = run_load(opts, tool, server, key, f"m{n}{side[0]}", opts.duration)
            rounds.append({"side": side, "round": n + 1, **result})
            print(f"  round {n + 1} {side:9}: {report.describe(result)}", flush=True)
    best_api = max((r for r in rounds if r["side"] == "fairmeter"), key=lambda r: r["rate"])
    best_bare = max((r for r in rounds if r["side"] == "bare"), key=lambda r: r["rate"])
    return best_api, best_bare, rounds


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    tool = choose_loadgen(opts.loadgen)
    load_before = os.getloadavg()
    print(f"preparing {BENCH_DATABASE} …", flush=True)
    url, key = prepare_database(opts.database_url)
    now = datetime.now(UTC)
    count = max(1, opts.events // opts.batch_size)
    batches = make_batches(count, opts.batch_size, now, "batch")
    warm = make_batches(WARM_BATCHES, opts.batch_size, now, "warm")
    copies = make_batches(count, opts.batch_size, now, "copy")
    half = max(1, count // 2)
    print(f"(a) COPY {half * opts.batch_size} events rows …", flush=True)
    copied = [bench_copy(url, copies[:half], now, "bench-copy-1")]
    analyze(url)
    env = {
        "DATABASE_URL": url,
        "REDIS_URL": opts.redis_url,
        "FAIRMETER_KEY_PEPPER": PEPPER,
        "FAIRMETER_LOG_LEVEL": "WARNING",
        # capacity for one tenant, not that tenant's share (rate_limit_tenant_events)
        "FAIRMETER_RATE_LIMIT_TENANT_EVENTS": str(10**9),
        "BENCH_DATABASE_URL": url,
        "BENCH_POOL_SIZE": str(max(4, opts.connections // opts.workers)),
    }
    api_env = env | dict(item.split("=", 1) for item in opts.api_env)
    api_port, bare_port = free_port(), free_port()
    with ExitStack() as stack:
        api = stack.enter_context(
            serve(
                "fairmeter",
                api_command(api_port, opts.workers),
                api_env,
                api_port,
                opts.workers,
                ROOT,
            )
        )
        bare = stack.enter_context(
            serve("bare", bare_command(bare_port, opts.workers), env, bare_port, opts.workers, ROOT)
        )
        print(f"(b) {count} batches of {opts.batch_size} over HTTP …", flush=True)
        bench_batches(api, key, [msgspec.json.encode(b) for b in warm], 2)
        bodies = [msgspec.json.encode(b) for b in batches]
        meter = CpuMeter(api, opts.database_url, BENCH_DATABASE)
        batch = bench_batches(api, key, bodies, opts.batch_connections).summary()
        batch["events"] = count * opts.batch_size
        batch["rate"] = round(batch["events"] / batch["elapsed_s"])
        batch["cpu_ms_per_1000"] = meter.per_unit_ms(count * opts.batch_size // 1000)
        print(f"(a) again, the other {(count - half) * opts.batch_size} rows …", flush=True)
        copied.append(bench_copy(url, copies[half:] or copies, now, "bench-copy-2"))
        analyze(url)
        print(f"(c)/(d) single events, {opts.connections} connections, loadgen {tool} …")
        single, bare_result, rounds = bench_single(opts, tool, api, bare, key)
    results = report.Results(
        command=report.command_line(argv if argv is not None else sys.argv[1:]),
        options=vars(opts) | {"docs": str(opts.docs)},
        loadgen=tool,
        versions=report.versions(url, tool),
        load_before=load_before,
        load_after=os.getloadavg(),
        copy=max(copied, key=lambda c: c["rate"]) | {"runs": copied},
        batch=batch,
        single=single,
        bare=bare_result,
        rounds=rounds,
        stored=count_events(url),
    )
    print(report.table(results))
    if not opts.no_docs:
        report.write_docs(opts.docs, results)
        print(f"wrote {opts.docs}")
    return 1 if opts.strict and not results.all_met() else 0


if __name__ == "__main__":
    sys.exit(main())
