"""Capacity bench (issue #18, ``make bench-capacity``): what one core of each tier does.

On a database of its own (``fairmeter_bench_capacity``, created, migrated, dropped at the
end), three phases, each measured in CPU seconds of the tier doing the work and of every
PostgreSQL backend of the database (``bench/tiers.py``):

1. **ingest** — the real API (``fairmeter serve``, 2 uvicorn workers) takes ``--events``
   events as 1,000-event batches over HTTP: runs of realistic shape, ~20 events each and
   hours old (``bench/settle.py``'s workload: completed, resumed, dropped, cancelled, …);
2. **settlement** — a real Celery worker (prefork, driven by beat → ``sweep_due_runs`` →
   ``settle_run_chunk``, on a redis-server of its own) settles every run those events made;
3. **webhook deliveries** — the same worker fans out and delivers ``--deliveries``
   ``run.settled`` notifications to one endpoint, ``bench/webhooks.py``'s receiver (204 to
   every POST), committed ``--wave`` at a time; between 2 and 3, the worker idle.

Units per CPU-second of a tier is that tier's capacity per core: on a shared machine the
work's CPU cost hardly moves while its speed does, so wall-clock rates are printed too but
are not capacities. The results replace the generated block of the "Capacity model"
section of docs/scaling.md (``bench/capacity_report.py``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import closing
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import msgspec
import psycopg
import redis
from celery import Celery

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python bench/capacity.py` puts bench/, not the root, first
    sys.path.insert(0, str(ROOT))

from bench import capacity_report, ingest, settle, webhooks  # noqa: E402
from bench.capacity_report import Phase  # noqa: E402
from bench.databases import SERVER, fresh_database  # noqa: E402
from bench.procs import free_port, serve  # noqa: E402
from bench.tiers import PostgresProcesses, TierCpu, process_tree  # noqa: E402
from metering.config import Settings  # noqa: E402
from metering.keys import Principal, Scope  # noqa: E402
from metering.keys_repo import create_key  # noqa: E402
from metering.notifications import Notification, record_many  # noqa: E402
from metering.prices import insert_prices, read_catalog_file  # noqa: E402
from metering.webhooks.endpoints import EndpointSpec, create_endpoint  # noqa: E402
from reconciler.kicks import kick_once  # noqa: E402

DATABASE = "fairmeter_bench_capacity"
PEPPER = "bench-capacity-pepper-0123456789abcdef0123456"
TENANT = settle.TENANT
WARM_BATCHES = 4


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--server-url", default=SERVER, help="any database on the local PostgreSQL server"
    )
    parser.add_argument("--redis-url", default=ingest.LOCAL_REDIS_URL, help="the API's")
    parser.add_argument("--database", default=DATABASE, help="created and dropped")
    parser.add_argument("--events", type=int, default=200_000, help="ingested, then settled")
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--connections", type=int, default=4, help="HTTP, for the batches")
    parser.add_argument("--api-workers", type=int, default=2, help="uvicorn workers")
    parser.add_argument("--concurrency", type=int, default=3, help="Celery worker processes")
    parser.add_argument("--deliveries", type=int, default=5000, help="webhooks delivered")
    parser.add_argument("--wave", type=int, default=500, help="notifications committed at once")
    parser.add_argument("--customers", type=int, default=400)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--sweep-interval", type=float, default=0.5, help="beat, seconds")
    parser.add_argument("--idle", type=float, default=5.0, help="seconds of idle worker")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per phase")
    parser.add_argument("--docs", type=Path, default=ROOT / "docs" / "scaling.md")
    parser.add_argument("--no-docs", action="store_true", help="print only")
    return parser.parse_args(argv)


# --- the workload -----------------------------------------------------------------------


def request_bodies(opts: argparse.Namespace) -> tuple[list[bytes], int]:
    """Whole runs of ``bench/settle.py``'s shapes packed into batches of at most
    ``--batch-size`` events until ``--events``; (bodies, events)."""
    bodies: list[bytes] = []
    batch: list[dict[str, Any]] = []
    total = 0
    for events in settle.workload(0, opts.events, opts.customers, opts.seed):
        if len(batch) + len(events) > opts.batch_size:
            bodies.append(msgspec.json.encode(batch))
            batch = []
        batch += events
        total += len(events)
        if total >= opts.events:
            break
    if batch:
        bodies.append(msgspec.json.encode(batch))
    return bodies, total


def prepare(opts: argparse.Namespace) -> tuple[str, str]:
    """The database at head with prices and the tenant's ingest key; (url, key)."""
    url = fresh_database(opts.database, opts.server_url)
    with psycopg.connect(url) as conn:
        insert_prices(conn, read_catalog_file())
        _, key = create_key(conn, tenant_id=TENANT, scope=Scope.INGEST, pepper=PEPPER)
    return url, key


def scalar(url: str, query: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(query.encode()).fetchone()
    return int(row[0]) if row and row[0] is not None else 0


# --- 1. ingest ------------------------------------------------------------------------


def ingest_phase(opts: argparse.Namespace, url: str, key: str, bodies: list[bytes]) -> Phase:
    """The batches over HTTP after a few unmeasured ones (connections, prepared statements)."""
    env = {
        "DATABASE_URL": url,
        "REDIS_URL": opts.redis_url,
        "FAIRMETER_KEY_PEPPER": PEPPER,
        "FAIRMETER_LOG_LEVEL": "WARNING",
        # capacity for one tenant, not that tenant's share (rate_limit_tenant_events)
        "FAIRMETER_RATE_LIMIT_TENANT_EVENTS": str(10**9),
    }
    port = free_port()
    warm = min(WARM_BATCHES, len(bodies) // 10)
    postgres = PostgresProcesses(opts.server_url)
    command = ingest.api_command(port, opts.api_workers)
    try:
        with serve("fairmeter", command, env, port, opts.api_workers, ROOT) as api:
            ingest.bench_batches(api, key, bodies[:warm], 2)
            before = scalar(url, "SELECT count(*) FROM events")
            meter = TierCpu(
                {
                    "api": api.processes,
                    "postgres": postgres.backends(opts.database),
                    "server": postgres.background(),
                }
            ).start()
            load = ingest.bench_batches(api, key, bodies[warm:], opts.connections)
            cpu = meter.stop()
    finally:
        postgres.close()
    if load.errors:
        raise RuntimeError(f"ingest answered {load.statuses}")
    stored = scalar(url, "SELECT count(*) FROM events") - before
    sent = sum(len(msgspec.json.decode(body)) for body in bodies[warm:])
    if stored != sent:
        raise RuntimeError(f"{sent} events sent, {stored} stored")
    return Phase(units=stored, wall_s=load.elapsed_s, cpu_s=cpu)


# --- 2. settlement and 3. webhook deliveries, by one real worker -------------------------


def worker_env(opts: argparse.Namespace, url: str, redis_url: str) -> dict[str, str]:
    tuning = argparse.Namespace(
        sweep_interval=opts.sweep_interval, chunk_size=None, sweep_batch=None
    )
    env = settle.worker_env(url, redis_url, tuning)
    # The endpoint's secret is sealed with the pepper: the worker must have the same one.
    env.update(FAIRMETER_KEY_PEPPER=PEPPER, FAIRMETER_WEBHOOKS_ALLOW_PRIVATE="true")
    return env


def worker_phases(opts: argparse.Namespace, url: str, receiver: str) -> tuple[Phase, Phase, Phase]:
    """Start a worker, let beat drive it through every due run, then through the webhooks;
    between the two, what it costs with nothing to do."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-capacity-"))
    postgres = PostgresProcesses(opts.server_url)
    worker_args = ["worker", "--concurrency", str(opts.concurrency), "--loglevel", "WARNING"]
    worker_args += ["--hostname", f"bench-capacity-{os.getpid()}@%h"]
    beat_args = ["beat", "--schedule", str(tmp / "beat-schedule"), "--loglevel", "WARNING"]
    try:
        with settle.private_redis() as redis_url:
            env = worker_env(opts, url, redis_url)
            client = Celery("bench", broker=redis_url)
            flags = redis.Redis.from_url(redis_url)

            def kick_fan_out() -> None:  # as settlement does after its commit
                send = partial(client.send_task, webhooks.FAN_OUT)
                kick_once(flags, webhooks.FAN_OUT, lambda expires_s: send(expires=expires_s))

            with (
                settle.celery(worker_args, env, tmp / "worker.log") as worker,
                psycopg.connect(url, autocommit=True) as conn,
                closing(client),
                closing(flags),
            ):
                settle.wait_for_worker(client, worker, tmp / "worker.log")
                tiers = {
                    "worker": lambda: process_tree(worker.pid),
                    "postgres": postgres.backends(opts.database),
                    "server": postgres.background(),
                }
                with settle.celery(beat_args, env, tmp / "beat.log"):
                    settled = settlement_phase(opts, url, conn, tiers)
                    wait_fanned_out(conn, opts.timeout)
                    idle = idle_phase(tiers, opts.idle)
                    delivered = delivery_phase(opts, url, conn, receiver, tiers, kick_fan_out)
    except BaseException:
        print(f"worker and beat logs kept in {tmp}", file=sys.stderr)
        raise
    finally:
        postgres.close()
    shutil.rmtree(tmp, ignore_errors=True)
    return settled, idle, delivered


def settlement_phase(
    opts: argparse.Namespace, url: str, conn: psycopg.Connection[Any], tiers: dict[str, Any]
) -> Phase:
    """From beat's start to the last decision; every run must have exactly one."""
    runs = scalar(url, "SELECT count(*) FROM runs")
    meter = TierCpu(tiers).start()
    started = settle.first_claim(conn, opts.timeout)
    watched = settle.watch(conn, runs, opts.timeout, started)
    cpu = meter.stop()
    settle.check(url, runs)
    return Phase(units=runs, wall_s=float(watched["seconds"]), cpu_s=cpu)


def wait_fanned_out(conn: psycopg.Connection[Any], timeout_s: float) -> None:
    """Until the fan-out's cursor has passed every notification recorded so far."""
    query = (
        "SELECT coalesce((SELECT fanned_out_to FROM webhook_fanout WHERE name = 'notifications'),"
        " 0) >= coalesce((SELECT max(id) FROM notifications), 0)"
    )
    deadline = time.monotonic() + timeout_s
    while not (row := conn.execute(query).fetchone()) or not row[0]:
        if time.monotonic() > deadline:
            raise TimeoutError("the fan-out did not catch up with settlement's notifications")
        time.sleep(0.2)


def idle_phase(tiers: dict[str, Any], seconds: float) -> Phase:
    """The worker with beat ticking and nothing to do: a floor every deployment pays, per
    worker, whatever its load (and which the phases around it include)."""
    meter = TierCpu(tiers).start()
    time.sleep(seconds)
    cpu = meter.stop()
    return Phase(units=0, wall_s=meter.elapsed_s, cpu_s=cpu)


def delivery_phase(
    opts: argparse.Namespace,
    url: str,
    conn: psycopg.Connection[Any],
    receiver: str,
    tiers: dict[str, Any],
    kick_fan_out: Callable[[], None],
) -> Phase:
    """``--deliveries`` run.settled notifications to one endpoint, committed ``--wave`` at a
    time, each wave once the receiver has the one before. Settlement's own notifications
    were fanned out before (to no endpoint), so the endpoint made now gets only these.

    Waves, because a claim's cost grows with the endpoint's backlog (see the Capacity model
    in docs/scaling.md): a worker that keeps up has a small one."""
    settings = Settings(database_url=url, key_pepper=PEPPER, webhooks_allow_private=True)
    spec = EndpointSpec(url=f"{receiver}/hook", event_types=["run.settled"])
    runs = conn.execute("SELECT id, subject, customer_id FROM runs ORDER BY id").fetchall()
    with conn.transaction():
        create_endpoint(conn, Principal(TENANT, Scope.ADMIN, "bench"), spec, settings)
    notes = [
        Notification(TENANT, customer, "run.settled", {"n": n}, run_id, subject)
        for n, (run_id, subject, customer) in (
            (n, runs[n % len(runs)]) for n in range(opts.deliveries)
        )
    ]
    httpx.delete(f"{receiver}/stats", timeout=60)
    meter = TierCpu(tiers).start()
    started = time.monotonic()
    arrived = 0
    for first in range(0, len(notes), opts.wave):
        wave = notes[first : first + opts.wave]
        with conn.transaction():
            record_many(conn, wave)
        kick_fan_out()
        arrived = len(webhooks.wait_for(receiver, first + len(wave), opts.timeout)["arrivals"])
        if arrived < first + len(wave):
            raise RuntimeError(f"{arrived} of {first + len(wave)} webhooks arrived")
    wall_s = time.monotonic() - started
    cpu = meter.stop()
    return Phase(units=arrived, wall_s=wall_s, cpu_s=cpu)


# --- the whole run ----------------------------------------------------------------------


def drop(opts: argparse.Namespace) -> None:
    with psycopg.connect(opts.server_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{opts.database}" WITH (FORCE)'.encode())


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    opts = parse_args(args)
    load_before = os.getloadavg()
    bodies, events = request_bodies(opts)
    print(f"{events:,} events in {len(bodies)} batches; preparing {opts.database} …", flush=True)
    url, key = prepare(opts)
    try:
        print("1. ingest over HTTP …", flush=True)
        ingested = ingest_phase(opts, url, key, bodies)
        runs = scalar(url, "SELECT count(*) FROM runs")
        total_events = scalar(url, "SELECT count(*) FROM events")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(b"VACUUM ANALYZE")  # as autovacuum would, between the phases
        print(f"2. settling {runs:,} runs, 3. {opts.deliveries:,} webhooks …", flush=True)
        with webhooks.receiver() as receiver:
            settled, idle, delivered = worker_phases(opts, url, receiver)
    finally:
        drop(opts)
    results = capacity_report.Results(
        command=capacity_report.command_line(args),
        options=vars(opts) | {"docs": str(opts.docs)},
        load_before=load_before,
        load_after=os.getloadavg(),
        events_per_run=total_events / max(1, runs),
        ingest=ingested,
        settlement=settled,
        idle=idle,
        deliveries=delivered,
    )
    print(capacity_report.table(results))
    if not opts.no_docs:
        capacity_report.write_docs(opts.docs, results)
        print(f"wrote {opts.docs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
