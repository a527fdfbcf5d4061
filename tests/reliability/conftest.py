"""Fault-injection fixtures: private servers, the service's processes, an ingest load.

In this directory ``settings``, ``engine``, ``db`` and ``make_key`` mean what they mean in
``tests/conftest.py``, but on a private PostgreSQL cluster started for the session: the
faults here must never reach the PostgreSQL that other sessions on the machine share, and
those sessions' load (they can fill its ``max_connections``) must not make these tests
fail. Every test also gets its own Redis (``private_redis``); a test that takes ``broker``
runs twice, with Celery on that Redis and on a private virtual host of the machine's
RabbitMQ (``rabbit_vhost``: the tests start no RabbitMQ of their own).

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
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from metering.config import Settings
from metering.db import create_db_engine, raw_transaction
from metering.keys import Scope
from metering.keys_repo import create_key
from tests.helpers import ROOT
from tests.helpers.celery_worker import start_celery, worker_env
from tests.helpers.database import DATA_TABLES, TEST_PEPPER
from tests.helpers.processes import free_port, wait_http
from tests.helpers.rabbitmq import RabbitVhost, rabbitmqctl_missing
from tests.reliability.load import HttpIngest
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


@pytest.fixture
def rabbit_vhost() -> Iterator[RabbitVhost]:
    """A virtual host of its own on the machine's RabbitMQ, deleted (queues, messages and
    all) when the test ends. RabbitMQ missing fails the test: ``.ci/run`` starts it."""
    missing = rabbitmqctl_missing()
    if missing is not None:
        pytest.fail(f"the RabbitMQ tests need the machine's RabbitMQ: {missing}")
    vhost = RabbitVhost()
    vhost.create()
    try:
        yield vhost
    finally:
        vhost.delete()


@pytest.fixture(params=["redis", "rabbitmq"])
def broker(request: pytest.FixtureRequest, private_redis: PrivateRedis) -> str:
    """Celery's broker URL for this run of the test: the test's own Redis, or RabbitMQ
    (quorum queues) in a private virtual host. Redis serves kicks and rate limits in both."""
    if request.param == "redis":
        return private_redis.url()
    vhost: RabbitVhost = request.getfixturevalue("rabbit_vhost")
    return vhost.url()


class Stack:
    """The service's processes for one test: API, Celery worker, beat."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self._procs: list[subprocess.Popen[bytes]] = []
        self._loads: list[HttpIngest] = []

    def env(
        self, settings: Settings, redis_url: str, broker_url: str | None = None, **overrides: str
    ) -> dict[str, str]:
        """The processes' environment; Celery on ``broker_url`` if given, else on Redis."""
        defaults = {
            "FAIRMETER_CLAIM_LEASE_S": CLAIM_LEASE_S,
            "FAIRMETER_IDLE_TIMEOUT_S": WINDOW_S,
            "FAIRMETER_RESUME_WINDOW_S": WINDOW_S,
        }
        if broker_url is not None:
            defaults["FAIRMETER_BROKER_URL"] = broker_url
        return worker_env(settings, REDIS_URL=redis_url, **{**defaults, **overrides})

    def worker(
        self, env: dict[str, str], name: str = "worker", include: str | None = None
    ) -> subprocess.Popen[bytes]:
        """A prefork worker with two children, logging every task it receives (INFO);
        ``include``: a module of extra tasks it loads (a test's own)."""
        args = ["worker", "--concurrency", "2", "--loglevel", "INFO"]
        args += ["--include", include] if include else []
        args += ["--hostname", f"{name}-{os.getpid()}-{next(_hosts)}@%h", "--without-mingle"]
        proc = start_celery([*args, "--without-gossip"], env, self.logs / f"{name}.log")
        self._procs.append(proc)
        # Celery gives up for good ("Could not start worker processes") when a child dies
        # while the pool is still starting, so faults begin once it is ready.
        wait_for(lambda: " ready." in self.log(name), 60, f"{name} was not ready")
        return proc

    def beat(self, env: dict[str, str]) -> subprocess.Popen[bytes]:
        schedule = self.logs / "beat-schedule"
        args = ["beat", "--schedule", str(schedule), "--loglevel", "INFO"]
        proc = start_celery(args, env, self.logs / "beat.log")
        self._procs.append(proc)
        return proc

    def api(self, env: dict[str, str], workers: int = 1) -> str:
        port = free_port()
        argv = [sys.executable, "-m", "cli", "serve", "--port", str(port)]
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
        wait_http(f"{base}/healthz")
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
