"""Write notifications inside the caller's transaction and wake listeners on commit."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from metering.notifications.catalogue import CHANNEL, EVENT_TYPES


@dataclass(frozen=True, slots=True)
class Notification:
    tenant_id: str
    customer_id: str
    type: str
    data: dict[str, Any] = field(default_factory=dict)
    run_id: int | None = None
    subject: str | None = None  # the run's public id, when it is about a run


def record(conn: psycopg.Connection[Any], notification: Notification) -> int:
    """Store one notification; its id."""
    return record_many(conn, [notification])[0]


def record_many(conn: psycopg.Connection[Any], notifications: Sequence[Notification]) -> list[int]:
    """Store notifications in order (ids ascending, so per run the order given is kept) and
    send one ``pg_notify`` per row; PostgreSQL delivers them only if the caller commits."""
    if not notifications:
        return []
    for n in notifications:
        if n.type not in EVENT_TYPES:
            raise ValueError(f"unknown notification type {n.type!r}")
    rows = conn.execute(
        """
        INSERT INTO notifications (tenant_id, customer_id, run_id, subject, type, data)
        SELECT t, c, r, s, ty, d
        FROM unnest(%s::text[], %s::text[], %s::bigint[], %s::text[], %s::text[], %s::jsonb[])
             WITH ORDINALITY AS x(t, c, r, s, ty, d, n)
        ORDER BY n
        RETURNING id, tenant_id, customer_id, subject
        """,
        (
            [n.tenant_id for n in notifications],
            [n.customer_id for n in notifications],
            [n.run_id for n in notifications],
            [n.subject for n in notifications],
            [n.type for n in notifications],
            [json.dumps(n.data) for n in notifications],
        ),
    ).fetchall()
    rows.sort(key=lambda r: r[0])
    conn.execute(
        "SELECT pg_notify(%s, p) FROM unnest(%s::text[]) AS p",
        (CHANNEL, [json.dumps([r[0], r[1], r[2], r[3]]) for r in rows]),
    )
    return [int(r[0]) for r in rows]
