"""Faults the reliability tests inject by hand: holding the settlement locks, finding the
Celery child that is mid-transaction (to kill it there)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psutil
import psycopg

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


def children_in_transaction(
    worker: subprocess.Popen[bytes], db: Any, *, waiting_on_a_lock: bool = False
) -> list[psutil.Process]:
    """The worker's children with an open database transaction, found by matching their
    sockets' ports with ``pg_stat_activity.client_port``. ``waiting_on_a_lock``: only those
    blocked on a lock (a chunk held by ``customers_locked``), not the short transactions of
    the beat's other tasks (webhooks, statement closing) that run every second."""
    busy_ports = {
        port
        for (port,) in db.execute(
            "SELECT client_port FROM pg_stat_activity WHERE datname = current_database() "
            "AND xact_start IS NOT NULL AND pid <> pg_backend_pid() "
            "AND (NOT %s OR wait_event_type = 'Lock')",
            (waiting_on_a_lock,),
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
