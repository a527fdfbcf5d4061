"""Fault-injection fixtures: private servers, the service's processes, an ingest load.

In this directory ``settings``, ``engine``, ``db`` and ``make_key`` mean what they mean in
``tests/conftest.py``, but on a private PostgreSQL cluster started for the session: the
faults here must never reach the PostgreSQL that other sessions on the machine share, and
those sessions' load (they can fill its ``max_connections``) must not make these tests
fail. Every test also gets its own Redis (``private_redis``).

Every process a test starts is registered with ``stack`` and stopped when the test ends,
whatever happened; every fault is undone in ``finally`` by the test that injected it.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg
import pytest

from metering.config import Settings
from metering.db import create_db_engine, raw_transaction
from metering.keys import Scope
from metering.keys_repo import create_key
from tests.conftest import DATA_TABLES, ROOT, TEST_PEPPER, free_port, wait_http
from tests.reconciler.conftest import start, worker_env
from tests.reliability.servers import PrivatePostgres, PrivateRedis, fairmeter_database, wait_for

# The reconciler suite's beat interval and grace, plus a claim lease short enough that the
# database sweep re-drives work a fault lost within a test's time. The workloads' events are
# half an hour old, so long idle and resume windows keep a run from being settled as
# abandoned before its terminal event (always its last) arrives: a fault that delays the
# rest of a run's events must not turn them into late evidence.
CLAIM_LEASE_S = "5"
WINDOW_S = "7200"
_hosts = itertools.count()


@pytest.fixture(scope="session")
def private_postgres() -> Iterator[PrivatePostgres]:
    server = PrivatePostgres()
    try:
        server.init()
        server.start()
        yield server
    finally:
        server.destroy()


@pytest.fixture(scope="session")
def settings(private_postgres: PrivatePostgres) -> Settings:
    return Settings(
        database_url=fairmeter_database(private_postgres),
        redis_url="redis://127.0.0.1:1/0",  # every test brings its own Redis
        key_pepper=TEST_PEPPER,
        log_json=False,
        log_level="WARNING",
    )


@pytest.fixture(scope="session")
def engine(settings: Settings) -> Iterator[Any]:
    engine = create_db_engine(settings)
    yield engine
    engine.dispose()


@pytest.fixture
def db(engine: Any, settings: Settings) -> Iterator[psycopg.Connection[Any]]:
    """A clean database for one test, and an autocommit connection to inspect it."""
    with raw_transaction(engine) as conn:
        conn.execute(f"TRUNCATE {', '.join(DATA_TABLES)} RESTART IDENTITY CASCADE")
    with psycopg.connect(settings.database_url, autocommit=True) as conn:
        yield conn


@pytest.fixture
def make_key(engine: Any, db: psycopg.Connection[Any]) -> Any:
    def factory(*, tenant: str = "acme", scope: str = "ingest") -> str:
        with raw_transaction(engine) as conn:
            _, raw = create_key(conn, tenant_id=tenant, scope=Scope(scope), pepper=TEST_PEPPER)
        return raw

    return factory


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path / "redis")
    server.start()
    try:
        yield server
    finally:
        server.stop()


class Stack:
    """The service's processes for one test: API, Celery worker, beat."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self._procs: list[subprocess.Popen[bytes]] = []
        self._loads: list[HttpIngest] = []

    def env(self, settings: Settings, redis_url: str, **overrides: str) -> dict[str, str]:
        defaults = {
            "FAIRMETER_CLAIM_LEASE_S": CLAIM_LEASE_S,
            "FAIRMETER_IDLE_TIMEOUT_S": WINDOW_S,
            "FAIRMETER_RESUME_WINDOW_S": WINDOW_S,
        }
        return worker_env(settings, REDIS_URL=redis_url, **{**defaults, **overrides})

    def worker(self, env: dict[str, str], name: str = "worker") -> subprocess.Popen[bytes]:
        """A prefork worker with two children, logging every task it receives (INFO)."""
        args = ["worker", "--concurrency", "2", "--loglevel", "INFO"]
        args += ["--hostname", f"{name}-{os.getpid()}-{next(_hosts)}@%h", "--without-mingle"]
        proc = start([*args, "--without-gossip"], env, self.logs / f"{name}.log")
        self._procs.append(proc)
        # Celery gives up for good ("Could not start worker processes") when a child dies
        # while the pool is still starting, so faults begin once it is ready.
        wait_for(lambda: " ready." in self.log(name), 60, f"{name} was not ready")
        return proc

    def beat(self, env: dict[str, str]) -> subprocess.Popen[bytes]:
        schedule = self.logs / "beat-schedule"
        args = ["beat", "--schedule", str(schedule), "--loglevel", "INFO"]
        proc = start(args, env, self.logs / "beat.log")
        self._procs.append(proc)
        return proc

    def api(self, env: dict[str, str], workers: int = 1) -> str:
        port = free_port()
        argv = [sys.executable, "-m", "api.cli", "serve", "--port", str(port)]
        proc = subprocess.Popen(
            [*argv, "--workers", str(workers)],
            cwd=ROOT,
            env=env,
            stdout=(self.logs / "api.log").open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._procs.append(proc)
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/healthz", deadline_s=60)
        return base

    def ingest(self, base_url: str, key: str, batches: Any, **options: Any) -> HttpIngest:
        """An HTTP ingest load (not started), stopped with the processes at the end."""
        load = HttpIngest(base_url, key, batches, **options)
        self._loads.append(load)
        return load

    def log(self, name: str) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop_all(self) -> None:
        """Stop the loads; SIGTERM every process group at once, SIGKILL what is left after
        20 s."""
        for load in self._loads:
            load.stop()
        running = [p for p in self._procs if p.poll() is None]
        for proc in running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for proc in running:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    logs = tmp_path / "logs"
    logs.mkdir()
    services = Stack(logs)
    try:
        yield services
    finally:
        services.stop_all()


CUSTOMER_LOCKS = """
SELECT pg_advisory_xact_lock(hashtextextended(%(tenant)s || '/' || c, 0))
FROM unnest(%(customers)s::text[]) AS c ORDER BY c
"""


@contextmanager
def customers_locked(dsn: str, customers: list[str], tenant: str = "acme") -> Iterator[None]:
    """Hold the customers' settlement locks (``repo.lock_customers``) until the block ends:
    settle tasks for them wait, inside the task, for as long as the test wants."""
    with psycopg.connect(dsn) as conn:
        conn.execute(CUSTOMER_LOCKS, {"tenant": tenant, "customers": customers})
        yield


def worker_children(worker: subprocess.Popen[bytes]) -> list[psutil.Process]:
    try:
        return psutil.Process(worker.pid).children()
    except psutil.NoSuchProcess:
        return []


def child_in_transaction(worker: subprocess.Popen[bytes], db: Any) -> psutil.Process | None:
    """A worker child with an open database transaction (mid-claim or mid-settlement)."""
    busy = children_in_transaction(worker, db)
    return busy[0] if busy else None


def children_in_transaction(worker: subprocess.Popen[bytes], db: Any) -> list[psutil.Process]:
    """The worker's children with an open database transaction, found by matching their
    sockets' ports with ``pg_stat_activity.client_port``."""
    busy_ports = {
        port
        for (port,) in db.execute(
            "SELECT client_port FROM pg_stat_activity WHERE datname = current_database() "
            "AND xact_start IS NOT NULL AND pid <> pg_backend_pid()"
        ).fetchall()
    }
    if not busy_ports:
        return []
    busy = []
    for child in worker_children(worker):
        try:
            ports = {c.laddr.port for c in child.net_connections(kind="tcp")}
        except psutil.NoSuchProcess:
            continue
        if ports & busy_ports:
            busy.append(child)
    return busy


@dataclass(frozen=True, slots=True)
class Attempt:
    phase: str
    status: int | None  # None: no HTTP answer (connection refused, reset, timeout)
    retry_after: str | None
    seconds: float
    error: str | None = None


@dataclass
class HttpIngest:
    """Threads that POST batches to ``/v1/events``, each batch again until it is accepted
    (as a client that owns its events would), recording every attempt with the phase the
    test was in when it was sent."""

    base_url: str
    key: str
    batches: list[list[dict[str, Any]]]
    threads: int = 2
    timeout_s: float = 15.0
    pause_s: float = 0.0
    phase: str = "before"
    attempts: list[Attempt] = field(default_factory=list)
    undelivered: list[int] = field(default_factory=list)
    _next: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _workers: list[threading.Thread] = field(default_factory=list)

    def start(self) -> HttpIngest:
        for _ in range(self.threads):
            thread = threading.Thread(target=self._run, daemon=True)
            thread.start()
            self._workers.append(thread)
        return self

    def join(self, timeout_s: float) -> bool:
        """Wait until every batch is accepted; on timeout stop retrying and say False."""
        deadline = time.monotonic() + timeout_s
        for thread in self._workers:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._stop.set()
        for thread in self._workers:
            thread.join(self.timeout_s + 1)
        return not self.undelivered and not any(t.is_alive() for t in self._workers)

    def stop(self) -> None:
        """Stop retrying (threads end after their current request)."""
        self._stop.set()

    def _take(self) -> int | None:
        with self._lock:
            if self._next >= len(self.batches):
                return None
            self._next += 1
            return self._next - 1

    def _run(self) -> None:
        with httpx.Client(timeout=self.timeout_s) as client:
            while not self._stop.is_set() and (index := self._take()) is not None:
                if not self._deliver(client, self.batches[index]):
                    with self._lock:
                        self.undelivered.append(index)
                time.sleep(self.pause_s)

    def _deliver(self, client: httpx.Client, batch: list[dict[str, Any]]) -> bool:
        headers = {
            "authorization": f"Bearer {self.key}",
            "content-type": "application/cloudevents-batch+json",
        }
        while not self._stop.is_set():
            phase, began = self.phase, time.monotonic()
            try:
                reply = client.post(f"{self.base_url}/v1/events", json=batch, headers=headers)
            except httpx.HTTPError as exc:
                self._record(Attempt(phase, None, None, time.monotonic() - began, repr(exc)))
                time.sleep(0.2)
                continue
            retry_after = reply.headers.get("retry-after")
            self._record(Attempt(phase, reply.status_code, retry_after, time.monotonic() - began))
            if reply.status_code < 300:
                return True
            if reply.status_code < 500 and reply.status_code != 429:
                return False  # refused for good: the batch is undelivered, the test fails
            time.sleep(min(float(retry_after or 0.2), 1.0))
        return False

    def _record(self, attempt: Attempt) -> None:
        with self._lock:
            self.attempts.append(attempt)

    def statuses(self, phase: str | None = None) -> dict[int | None, int]:
        counts: dict[int | None, int] = {}
        for a in self.attempts:
            if phase is None or a.phase == phase:
                counts[a.status] = counts.get(a.status, 0) + 1
        return counts
