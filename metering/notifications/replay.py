"""Reading notifications back for a live stream: one run's or one customer's, after an id.

The table is the stream's memory. A stream that resumes after ``Last-Event-ID``, a client
that fell behind, and every stream of a process whose listening connection was lost all
catch up here, so the in-memory fan-out may drop whatever it likes and nothing is lost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

# Rows per catch-up query: a stream that resumes far back sends page after page.
PAGE = 500

COLUMNS = "id, tenant_id, customer_id, run_id, subject, type, data, created_at"


@dataclass(frozen=True, slots=True)
class StreamScope:
    """What one stream follows: every notification of a customer, or of one of its runs."""

    tenant_id: str
    customer_id: str
    run_id: int | None = None  # None: the whole customer
    subject: str | None = None  # the run's public id, for a run's stream


@dataclass(frozen=True, slots=True)
class StoredNotification:
    id: int
    tenant_id: str
    customer_id: str
    run_id: int | None
    subject: str | None
    type: str
    data: dict[str, Any]
    created_at: datetime

    def within(self, scope: StreamScope) -> bool:
        """Whether a stream of ``scope`` shows this notification (same tenant and customer,
        and the same run for a run's stream)."""
        if (self.tenant_id, self.customer_id) != (scope.tenant_id, scope.customer_id):
            return False
        return scope.run_id is None or self.run_id == scope.run_id


def from_row(row: Sequence[Any]) -> StoredNotification:
    """A row of ``SELECT {COLUMNS}``, as a value (also for the edge's async connection)."""
    nid, tenant, customer, run_id, subject, kind, data, created_at = row
    return StoredNotification(
        int(nid), tenant, customer, run_id, subject, kind, dict(data or {}), created_at
    )


def after(
    conn: psycopg.Connection[Any], scope: StreamScope, after_id: int, limit: int = PAGE
) -> list[StoredNotification]:
    """The scope's notifications with an id above ``after_id``, oldest first, at most
    ``limit`` (call again from the last id for the next page)."""
    if scope.run_id is not None:
        rows = conn.execute(
            f"SELECT {COLUMNS} FROM notifications WHERE run_id = %s AND id > %s "
            "ORDER BY id LIMIT %s",
            (scope.run_id, after_id, limit),
        ).fetchall()
    else:
        rows = conn.execute(
            f"SELECT {COLUMNS} FROM notifications "
            "WHERE tenant_id = %s AND customer_id = %s AND id > %s ORDER BY id LIMIT %s",
            (scope.tenant_id, scope.customer_id, after_id, limit),
        ).fetchall()
    return [from_row(r) for r in rows]


def latest_id(conn: psycopg.Connection[Any], scope: StreamScope) -> int:
    """The id of the scope's latest notification; 0 when it has none."""
    if scope.run_id is not None:
        row = conn.execute(
            "SELECT max(id) FROM notifications WHERE run_id = %s", (scope.run_id,)
        ).fetchone()
    else:
        row = conn.execute(
            "SELECT max(id) FROM notifications WHERE tenant_id = %s AND customer_id = %s",
            (scope.tenant_id, scope.customer_id),
        ).fetchone()
    return int(row[0]) if row and row[0] is not None else 0


BY_IDS = f"SELECT {COLUMNS} FROM notifications WHERE id = ANY(%s) ORDER BY id"


def by_ids(conn: psycopg.Connection[Any], ids: Sequence[int]) -> list[StoredNotification]:
    """The notifications with these ids (those announced on commit), oldest first."""
    if not ids:
        return []
    return [from_row(r) for r in conn.execute(BY_IDS, (list(ids),)).fetchall()]
