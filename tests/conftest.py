"""Shared fixtures: a real PostgreSQL database built by `alembic upgrade head`, real Redis."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from litestar.testing import TestClient

from metering.config import Settings
from metering.db import create_db_engine, raw_transaction
from metering.keys import Scope
from metering.keys_repo import create_key
from metering.migrate import upgrade
from metering.prices import PROVIDER_COSTS, insert_prices
from tests.helpers import ROOT
from tests.helpers.browser import chromium
from tests.helpers.catalog import stable_costs, stable_prices
from tests.helpers.database import DATA_TABLES, TEST_PEPPER
from tests.helpers.processes import free_port, service_env, wait_http
from tests.helpers.services import (
    TEST_DATABASE,
    drop_database,
    drop_stale_test_databases,
    plain_url,
    recreate_database,
    redis_url,
    server_database_url,
)


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    server = server_database_url()
    drop_stale_test_databases(server)
    url = recreate_database(server, TEST_DATABASE)
    upgrade(url)
    with psycopg.connect(url) as conn:
        insert_prices(conn, stable_prices())
        insert_prices(conn, stable_costs(), PROVIDER_COSTS)
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
    # A new table that holds a test's data goes into DATA_TABLES (tests/helpers/database.py).
    # A sweep of an earlier module's worker still finishing can deadlock with the TRUNCATE
    # (PostgreSQL then aborts one side): seen once in CI; the TRUNCATE is tried again.
    for attempt in range(5):
        try:
            with raw_transaction(engine) as conn:
                conn.execute(f"TRUNCATE {', '.join(DATA_TABLES)} RESTART IDENTITY CASCADE")
            break
        except psycopg.errors.DeadlockDetected:
            if attempt == 4:
                raise
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


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless Chromium for the tests of one module that drive pages, closed after them.

    Playwright's sync API runs its event loop on the thread that opened it, and the loop
    counts as running on that thread until the browser is closed: a second ``chromium()``
    fails ("Sync API inside the asyncio loop"), and so does any ``asyncio.run`` (the
    capacity bench's load generator). So no test opens its own, and none outlives its
    module: the make-up test failed when the browser tests ran before it, and the capacity
    smoke test when a browser opened by an earlier module was still open.
    """
    with chromium() as instance:
        yield instance
