"""Write notifications inside the caller's transaction and wake listeners on commit."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
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


# One statement with one JSON parameter: record_many runs on the ingest hot path, and
# psycopg builds array parameters element by element in Python (msgspec encodes the rows
# in C). Rows are inserted in the order given, so ids ascend in it; the notifies go out in
# id order (a sorted subquery is not merged into the query around it, so its rows reach
# ``pg_notify`` in that order), each payload ``[id, tenant, customer, subject]``.
RECORD = """
WITH stored AS (
    INSERT INTO notifications (tenant_id, customer_id, run_id, subject, type, data)
    SELECT v->>'tenant_id', v->>'customer_id', (v->>'run_id')::bigint, v->>'subject',
           v->>'type', (v->'data')::jsonb
    FROM json_array_elements(%(rows)s::json) WITH ORDINALITY AS x(v, n)
    ORDER BY n
    RETURNING id, tenant_id, customer_id, subject
)
SELECT id, pg_notify(%(channel)s, json_build_array(id, tenant_id, customer_id, subject)::text)
FROM (SELECT * FROM stored ORDER BY id) AS in_order
"""


def record_many(conn: psycopg.Connection[Any], notifications: Sequence[Notification]) -> list[int]:
    """Store notifications in order (ids ascending, so per run the order given is kept) and
    send one ``pg_notify`` per row; PostgreSQL delivers them only if the caller commits."""
    if not notifications:
        return []
    for n in notifications:
        if n.type not in EVENT_TYPES:
            raise ValueError(f"unknown notification type {n.type!r}")
    rows = conn.execute(
        RECORD, {"rows": msgspec.json.encode(notifications).decode(), "channel": CHANNEL}
    ).fetchall()
    return [int(r[0]) for r in rows]
