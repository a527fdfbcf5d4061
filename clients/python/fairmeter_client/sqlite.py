"""The spool's SQLite file: connection settings, locking and schema (see ``spool``)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Literal

from fairmeter_client.errors import SpoolLockedError

Synchronous = Literal["FULL", "NORMAL"]
SCHEMA_VERSION = 1
SCHEMA = """
CREATE TABLE IF NOT EXISTS queue (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    source TEXT NOT NULL,
    event_id TEXT NOT NULL,
    body TEXT NOT NULL,
    size INTEGER NOT NULL,
    enqueued_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS dead_letters (
    seq INTEGER PRIMARY KEY,
    source TEXT NOT NULL,
    event_id TEXT NOT NULL,
    body TEXT NOT NULL,
    size INTEGER NOT NULL,
    status INTEGER,
    code TEXT NOT NULL,
    detail TEXT NOT NULL,
    problem TEXT NOT NULL,
    dead_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS known_ids (
    source TEXT NOT NULL,
    event_id TEXT NOT NULL,
    content_hash TEXT NOT NULL,
    created_at REAL NOT NULL,
    delivered_at REAL,
    PRIMARY KEY (source, event_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS known_ids_delivered ON known_ids (delivered_at);
CREATE TABLE IF NOT EXISTS sequences (
    source TEXT NOT NULL,
    run TEXT NOT NULL,
    name TEXT NOT NULL,
    value INTEGER NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (source, run, name)
) WITHOUT ROWID;
"""
# Plain UPSERT + SELECT rather than RETURNING: agent hosts may have SQLite older than 3.35.
BUMP_SEQUENCE = """
INSERT INTO sequences (source, run, name, value, updated_at) VALUES (?, ?, ?, 1, ?)
ON CONFLICT (source, run, name) DO UPDATE SET value = value + 1, updated_at = excluded.updated_at
"""
READ_SEQUENCE = "SELECT value FROM sequences WHERE source = ? AND run = ? AND name = ?"


def open_spool(path: Path, synchronous: Synchronous, lock_timeout_s: float) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(
        path, timeout=lock_timeout_s, isolation_level=None, check_same_thread=False
    )
    try:
        # Exclusive before WAL: the lock is taken by the first access and held until close.
        conn.execute("PRAGMA locking_mode = EXCLUSIVE")
        conn.execute("PRAGMA auto_vacuum = INCREMENTAL")  # only effective on a new file
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        conn.execute("BEGIN IMMEDIATE")
        if conn.execute("PRAGMA user_version").fetchone()[0] > SCHEMA_VERSION:
            raise RuntimeError(f"{path} was written by a newer client")
        _create_schema(conn)
        conn.execute("COMMIT")
    except BaseException as exc:
        conn.close()
        if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
            raise SpoolLockedError(f"{path} is in use by another process") from exc
        raise
    return conn


def _create_schema(conn: sqlite3.Connection) -> None:
    # executescript() would commit the open transaction; run the statements one by one.
    for statement in SCHEMA.split(";"):
        if statement.strip():
            conn.execute(statement)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
