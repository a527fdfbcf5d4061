"""Fan-out: each new notification becomes one message per matching endpoint of its tenant.

The fan-out reads ``notifications`` in id order from a durable cursor (``webhook_fanout``),
locked for the transaction, so two workers fanning out at once take turns and neither
skips nor doubles a row; a message is unique per (endpoint, notification) besides, so a
repeat is a no-op that says so.

Ids are handed out when a row is inserted, not when its transaction commits: a row can
become visible after one with a higher id that the cursor already passed. Such an id is
remembered as a gap, with when it was first missed, and looked for at every fan-out until
``webhooks_fanout_horizon_s`` after (longer than any transaction that records a
notification stays open); an id still missing then belonged to a transaction that rolled
back. So no committed notification is skipped, and the cursor never waits on a rollback.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from sqlalchemy.engine import Engine

from metering.config import Settings
from metering.db import raw_transaction
from metering.runs import RunView, run_document, run_views
from metering.webhooks.payload import message_body

log = logging.getLogger("fairmeter.webhooks")

CURSOR_NAME = "notifications"
# Ids tracked as gaps at most; a larger jump (a sequence moved by hand) is taken as holes.
MAX_GAPS = 10_000


@dataclass(frozen=True, slots=True)
class Cursor:
    fanned_out_to: int
    gaps: dict[int, float] = field(default_factory=dict)  # id → first missed (epoch s)


def advance(
    cursor: Cursor, new_ids: Sequence[int], found_gaps: set[int], now_s: float, horizon_s: float
) -> Cursor:
    """The cursor after reading ``new_ids`` (ascending, all above the cursor) and finding
    ``found_gaps`` among its gaps: the gaps left, those newly seen, and none past the
    horizon."""
    gaps = {
        i: first
        for i, first in cursor.gaps.items()
        if i not in found_gaps and now_s - first < horizon_s
    }
    previous = cursor.fanned_out_to
    for current in new_ids:
        if current - previous - 1 > MAX_GAPS - len(gaps):
            log.warning("notification ids jump from %d to %d: not tracked", previous, current)
        else:
            gaps.update(dict.fromkeys(range(previous + 1, current), now_s))
        previous = current
    return Cursor(max(previous, cursor.fanned_out_to), gaps)


def _lock_cursor(conn: psycopg.Connection[Any]) -> Cursor:
    conn.execute(
        "INSERT INTO webhook_fanout (name, fanned_out_to) VALUES (%s, 0) ON CONFLICT DO NOTHING",
        (CURSOR_NAME,),
    )
    row = conn.execute(
        "SELECT fanned_out_to, gaps FROM webhook_fanout WHERE name = %s FOR UPDATE",
        (CURSOR_NAME,),
    ).fetchone()
    assert row is not None
    return Cursor(int(row[0]), {int(k): float(v) for k, v in row[1].items()})


def _save_cursor(conn: psycopg.Connection[Any], cursor: Cursor) -> None:
    conn.execute(
        "UPDATE webhook_fanout SET fanned_out_to = %s, gaps = %s, updated_at = now() "
        "WHERE name = %s",
        (
            cursor.fanned_out_to,
            json.dumps({str(k): v for k, v in cursor.gaps.items()}),
            CURSOR_NAME,
        ),
    )


NOTIFICATION = "SELECT id, tenant_id, run_id, subject, type, data, created_at FROM notifications"
TARGETS = """
SELECT n.id, e.id FROM notifications n
JOIN webhook_endpoints e ON e.tenant_id = n.tenant_id
WHERE n.id = ANY(%s) AND e.enabled AND n.created_at >= e.created_at
  AND (cardinality(e.event_types) = 0 OR n.type = ANY(e.event_types))
ORDER BY n.id, e.id
"""
INSERT_MESSAGES = """
INSERT INTO webhook_messages (msg_id, tenant_id, endpoint_id, notification_id, run_id, subject,
                              type, payload, status, next_attempt_at)
SELECT m, t, e, n, r, s, ty, p, 'pending', %s
FROM unnest(%s::text[], %s::text[], %s::text[], %s::bigint[], %s::bigint[], %s::text[],
            %s::text[], %s::text[]) WITH ORDINALITY AS x(m, t, e, n, r, s, ty, p, o)
ORDER BY o
ON CONFLICT (endpoint_id, notification_id, tenant_id) DO NOTHING
RETURNING id
"""


@dataclass(frozen=True, slots=True)
class FanOutReport:
    read: int  # notifications read past the cursor
    created: int  # messages made


def fan_out(conn: psycopg.Connection[Any], settings: Settings, now: datetime) -> FanOutReport:
    """One batch: read notifications past the cursor and the gaps that turned up, make
    their messages, move the cursor. In the caller's transaction."""
    cursor = _lock_cursor(conn)
    new = conn.execute(
        NOTIFICATION + " WHERE id > %s ORDER BY id LIMIT %s",
        (cursor.fanned_out_to, settings.webhooks_fanout_batch),
    ).fetchall()
    late = (
        conn.execute(
            NOTIFICATION + " WHERE id = ANY(%s) ORDER BY id", (list(cursor.gaps),)
        ).fetchall()
        if cursor.gaps
        else []
    )
    created = _make_messages(conn, [*late, *new], now)
    moved = advance(
        cursor,
        [int(r[0]) for r in new],
        {int(r[0]) for r in late},
        now.timestamp(),
        settings.webhooks_fanout_horizon_s,
    )
    _save_cursor(conn, moved)
    return FanOutReport(read=len(new), created=created)


def _make_messages(conn: psycopg.Connection[Any], rows: Sequence[Any], now: datetime) -> int:
    if not rows:
        return 0
    by_id = {int(r[0]): r for r in rows}
    targets = conn.execute(TARGETS, (list(by_id),)).fetchall()
    if not targets:
        return 0
    # Every run the batch's messages embed, read at once (not a few queries per run).
    targeted = {int(t[0]) for t in targets}
    runs = run_views(conn, [by_id[n][2] for n in targeted if by_id[n][2] is not None])
    bodies: dict[int, str] = {}
    columns: list[list[Any]] = [[] for _ in range(8)]
    for notification_id, endpoint_id in targets:
        row = by_id[int(notification_id)]
        if notification_id not in bodies:
            bodies[notification_id] = _body(row, runs)
        values = (
            "msg_" + secrets.token_hex(12),
            row[1],
            endpoint_id,
            notification_id,
            row[2],
            row[3],
            row[4],
            bodies[notification_id],
        )
        for column, value in zip(columns, values, strict=True):
            column.append(value)
    return len(conn.execute(INSERT_MESSAGES, (now, *columns)).fetchall())


def _body(row: Sequence[Any], runs: dict[int, RunView]) -> str:
    """The message body: the event's own fields and its run as ``GET /v1/runs/{run}``
    shows it (``None`` when the notification names no run, or one that is gone)."""
    _, _, run_id, _, type_, data, created_at = row
    view = runs.get(run_id) if run_id is not None else None
    run = run_document(view) if view is not None else None
    return message_body(type_, created_at, data, run).decode()


def fan_out_pending(
    engine: Engine, settings: Settings, clock: Callable[[], datetime], budget_s: float = 20.0
) -> int:
    """Fan out batch after batch until caught up (or ``budget_s`` spent); messages made."""
    deadline = time.monotonic() + budget_s
    created = 0
    while True:
        with raw_transaction(engine) as conn:
            report = fan_out(conn, settings, clock())
        created += report.created
        if report.read < settings.webhooks_fanout_batch or time.monotonic() > deadline:
            return created
