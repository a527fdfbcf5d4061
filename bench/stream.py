"""Live status stream benchmark: from a notification's commit to its Server-Sent Event.

One run, on a database of its own (``fairmeter_bench_stream``, dropped and re-created):

1. stores ``--streams`` runs of one customer and starts the API (``fairmeter serve``, two
   workers unless ``--workers``, each with its own LISTEN connection), rate limits off;
2. opens one run stream per run (``GET /v1/runs/{run}/stream``, raw asyncio sockets, so the
   client costs little) and, beside them, a bare ``LISTEN`` connection of its own: the
   floor that any fan-out through PostgreSQL stands on;
3. commits ``--notifications`` status changes to random runs, ``--interval-ms`` apart, each in
   its own transaction, and times each from just before its COMMIT to (a) the notify on the
   bare LISTEN and (b) the event on that run's stream.

It prints p50/p90/p99/max of both and their ratios, and checks that every event arrived
exactly once. Everything it starts is stopped, and its database dropped, before it returns.
Issue #16's target: SSE p99 < 250 ms with 1,000 open streams.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

from bench.databases import SERVER, fresh_database
from bench.procs import free_port, serve
from metering.db import raw_transaction
from metering.keys import Scope
from metering.keys_repo import create_key, ensure_tenant
from metering.notifications import CHANNEL, Notification, record

ROOT = Path(__file__).resolve().parents[1]
PEPPER = "bench-stream-pepper-0123456789abcdef0123456789"
DATABASE = "fairmeter_bench_stream"
P99_TARGET_MS = 250.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--notifications", type=int, default=300)
    parser.add_argument("--interval-ms", type=float, default=20.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--keep-database", action="store_true")
    return parser.parse_args(argv)


def seed(url: str, streams: int) -> tuple[str, list[int]]:
    """``streams`` runs of customer c1 of tenant bench (ids in order) and a support key."""
    import sqlalchemy as sa

    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    with raw_transaction(engine) as conn:
        ensure_tenant(conn, "bench")
        conn.execute("INSERT INTO customers (tenant_id, id) VALUES ('bench', 'c1')")
        now = "now()"
        rows = conn.execute(
            f"""
            INSERT INTO runs (tenant_id, subject, customer_id, first_event_at, last_event_at,
                              last_received_at, event_count)
            SELECT 'bench', 'run-' || n, 'c1', {now}, {now}, {now}, 0
            FROM generate_series(1, %s) AS n ORDER BY n RETURNING id
            """,
            (streams,),
        ).fetchall()
        _, key = create_key(conn, tenant_id="bench", scope=Scope.SUPPORT, pepper=PEPPER)
    engine.dispose()
    return key, [int(r[0]) for r in rows]


async def open_stream(port: int, key: str, subject: str) -> tuple[Any, Any]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
    writer.write(
        f"GET /v1/runs/{subject}/stream HTTP/1.1\r\nHost: bench\r\n"
        f"Authorization: Bearer {key}\r\nAccept: text/event-stream\r\n\r\n".encode()
    )
    await writer.drain()
    status = await reader.readline()
    if b" 200 " not in status:
        raise RuntimeError(f"{subject}: {status!r}")
    while (await reader.readline()) not in (b"\r\n", b""):
        pass  # headers
    return reader, writer


NOTIFICATION_ID = re.compile(rb'"id":(\d+)')


async def read_events(reader: Any, arrivals: dict[int, list[float]]) -> None:
    """Every event's arrival time by its notification id, the first ``"id"`` of its
    ``data:`` line (the ``id:`` line is a resume token; chunked framing lines are neither)."""
    while line := await reader.readline():
        if line.startswith(b"data: ") and (found := NOTIFICATION_ID.search(line)):
            arrivals.setdefault(int(found.group(1)), []).append(time.monotonic())


async def bare_listen(url: str, heard: dict[int, float], ready: asyncio.Event) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(f"LISTEN {CHANNEL}")
        ready.set()
        async for notify in conn.notifies():
            heard[int(json.loads(notify.payload)[0])] = time.monotonic()


def commit_notifications(url: str, runs: list[int], args: argparse.Namespace) -> dict[int, float]:
    """Commit the status changes through ``record``, as a worker does, each in its own
    transaction; id → the moment just before its COMMIT. On a thread: the event loop keeps
    reading the streams meanwhile."""
    committed: dict[int, float] = {}
    rng = random.Random(16)
    with psycopg.connect(url) as conn:
        for n in range(args.notifications):
            index = rng.randrange(len(runs))
            change = Notification(
                "bench", "c1", "run.status_changed", {"n": n}, runs[index], f"run-{index + 1}"
            )
            nid = record(conn, change)
            committed[nid] = time.monotonic()
            conn.commit()
            time.sleep(args.interval_ms / 1000)
    return committed


def percentiles(values_ms: list[float]) -> dict[str, float]:
    ordered = sorted(values_ms)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {"p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "max": ordered[-1]}


async def measure(url: str, port: int, key: str, runs: list[int], args: argparse.Namespace) -> int:
    arrivals: dict[int, list[float]] = {}
    heard: dict[int, float] = {}
    ready = asyncio.Event()
    listener = asyncio.create_task(bare_listen(url, heard, ready))
    started = time.monotonic()
    streams = []
    for start in range(0, len(runs), 100):  # opened in waves: not a thundering herd
        wave = range(start, min(len(runs), start + 100))
        streams += await asyncio.gather(*(open_stream(port, key, f"run-{i + 1}") for i in wave))
    readers = [asyncio.create_task(read_events(r, arrivals)) for r, _ in streams]
    await ready.wait()
    await asyncio.sleep(1.0)  # every stream past its snapshot and catch-up
    print(f"{len(streams)} streams open in {time.monotonic() - started:.1f}s", flush=True)
    committed = await asyncio.to_thread(commit_notifications, url, runs, args)
    await asyncio.sleep(2.0)
    for task in [*readers, listener]:
        task.cancel()
    for _, writer in streams:
        writer.close()
    snapshot_ids = {0}
    got = {nid: times for nid, times in arrivals.items() if nid not in snapshot_ids}
    missing = sorted(set(committed) - set(got))
    twice = sorted(nid for nid, times in got.items() if len(times) > 1)
    sse = [(got[nid][0] - at) * 1000 for nid, at in committed.items() if nid in got]
    bare = [(heard[nid] - at) * 1000 for nid, at in committed.items() if nid in heard]
    report(args, percentiles(sse), percentiles(bare), missing, twice)
    return 1 if missing or twice else 0


def report(
    args: argparse.Namespace,
    sse: dict[str, float],
    bare: dict[str, float],
    missing: list[int],
    twice: list[int],
) -> None:
    print(f"command: {shlex.join([sys.executable, '-m', 'bench.stream', *sys.argv[1:]])}")
    print(f"load average: {os.getloadavg()}, cpus: {os.cpu_count()}")
    print(
        f"{args.streams} streams, {args.notifications} notifications {args.interval_ms:g} ms "
        f"apart, {args.workers} API worker(s)"
    )
    print("| from COMMIT to | p50 ms | p90 ms | p99 ms | max ms |")
    print("|---|---|---|---|---|")
    columns = ("p50", "p90", "p99", "max")
    for name, row in (("bare LISTEN", bare), ("SSE event", sse)):
        print(f"| {name} | " + " | ".join(f"{row[k]:.1f}" for k in columns) + " |")
    print(
        "| ratio SSE / bare | "
        + " | ".join(f"{sse[k] / max(bare[k], 0.001):.1f}" for k in columns)
        + " |"
    )
    met = "met" if sse["p99"] < P99_TARGET_MS else "NOT met"
    print(f"target SSE p99 < {P99_TARGET_MS:g} ms: {met}")
    print(f"missing: {len(missing)}, delivered twice: {len(twice)}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    url = fresh_database(DATABASE)
    try:
        key, runs = seed(url, args.streams)
        port = free_port()
        env = {
            "DATABASE_URL": url,
            "FAIRMETER_KEY_PEPPER": PEPPER,
            "FAIRMETER_RATE_LIMIT_ENABLED": "false",
            "FAIRMETER_STREAM_MAX_PER_PROCESS": str(args.streams + 10),
            "FAIRMETER_STREAM_MAX_PER_KEY": str(args.streams + 10),
            "FAIRMETER_STREAM_MAX_PER_TENANT": str(args.streams + 10),
            "FAIRMETER_LOG_LEVEL": "WARNING",
        }
        cmd = [sys.executable, "-m", "cli", "serve", "--port", str(port)]
        cmd += ["--workers", str(args.workers)]
        with serve("api", cmd, env, port, args.workers, ROOT):
            return asyncio.run(measure(url, port, key, runs, args))
    finally:
        if not args.keep_database:
            with psycopg.connect(SERVER, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')


if __name__ == "__main__":
    raise SystemExit(main())
