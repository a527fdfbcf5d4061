"""Shared fixtures: a real PostgreSQL database built by `alembic upgrade head`, real Redis."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from litestar.testing import TestClient

from metering.config import Settings
from metering.db import create_db_engine, raw_transaction
from metering.keys import Scope
from metering.keys_repo import create_key
from metering.migrate import upgrade
from metering.prices import insert_prices
from tests.support.catalog import stable_prices
from tests.support.services import (
    TEST_DATABASE,
    drop_database,
    drop_stale_test_databases,
    plain_url,
    recreate_database,
    redis_url,
    server_database_url,
)

ROOT = Path(__file__).resolve().parents[1]
TEST_PEPPER = "test-pepper"
# Tables that hold a test's data; prices and the schema version survive between tests.
DATA_TABLES = (
    "audit_log",
    "disputes",
    "statement_lines",
    "stripe_deliveries",
    "stripe_outbox",
    "stripe_carries",
    "stripe_webhook_inbox",
    "stripe_closed_periods",
    "stripe_invoices",
    "decisions",
    "ledger_entries",
    "usage_lines",
    "events",
    "runs",
    "api_keys",
    "customers",
    "tenants",
)


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    server = server_database_url()
    drop_stale_test_databases(server)
    url = recreate_database(server, TEST_DATABASE)
    upgrade(url)
    with psycopg.connect(url) as conn:
        insert_prices(conn, stable_prices())
    yield url
    drop_database(server, TEST_DATABASE)


@pytest.fixture(scope="session")
def redis_service_url() -> str:
    return redis_url()


@pytest.fixture(scope="session")
def settings(database_url: str, redis_service_url: str) -> Settings:
    return Settings(
        database_url=database_url,
        redis_url=redis_service_url,
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
def db(engine: Any) -> Iterator[psycopg.Connection[Any]]:
    """A clean database for one test, and an autocommit connection to inspect it."""
    with raw_transaction(engine) as conn:
        conn.execute(f"TRUNCATE {', '.join(DATA_TABLES)} RESTART IDENTITY CASCADE")
    with psycopg.connect(
        plain_url(str(engine.url.render_as_string(hide_password=False))), autocommit=True
    ) as conn:
        yield conn


KeyFactory = Callable[..., str]


@pytest.fixture
def make_key(engine: Any, db: psycopg.Connection[Any]) -> KeyFactory:
    """``make_key(tenant="acme", scope="ingest", customer=None)`` → a raw API key."""

    def factory(*, tenant: str = "acme", scope: str = "ingest", customer: str | None = None) -> str:
        with raw_transaction(engine) as conn:
            _, raw = create_key(
                conn, tenant_id=tenant, scope=Scope(scope), pepper=TEST_PEPPER, customer_id=customer
            )
        return raw

    return factory


@pytest.fixture
def client(settings: Settings, db: psycopg.Connection[Any]) -> Iterator[TestClient[Any]]:
    from api.app import create_app

    with TestClient(app=create_app(settings)) as test_client:
        yield test_client


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def service_env(settings: Settings) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DATABASE_URL=settings.database_url,
        REDIS_URL=settings.redis_url,
        FAIRMETER_KEY_PEPPER=settings.key_pepper,
        FAIRMETER_LOG_LEVEL="WARNING",
    )
    return env


def wait_http(url: str, deadline_s: float = 30.0) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer within {deadline_s}s")


@pytest.fixture(scope="session")
def live_server(settings: Settings) -> Iterator[str]:
    """The real API under uvicorn in its own process, as deployed."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli", "serve", "--port", str(port), "--workers", "2"],
        cwd=ROOT,
        env=service_env(settings),
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{base}/healthz")
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
