"""Databases of the bench scripts' own, on the local server, dropped and re-created at head."""

from __future__ import annotations

import psycopg

from metering.migrate import upgrade

SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"


def fresh_database(name: str, server: str = SERVER) -> str:
    """Drop ``name`` (closing its sessions), create it empty, migrate it; return its URL."""
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    url = server.rsplit("/", 1)[0] + f"/{name}"
    upgrade(url)
    return url


def drop_database(name: str, server: str = SERVER) -> None:
    """Drop ``name``, closing its sessions: a bench leaves no database behind."""
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
