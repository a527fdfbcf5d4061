"""An endpoint's delivery log, and redelivering: one message, or everything since a time.

A redelivered message is sent again under its own ``webhook-id`` with its own frozen body
(receivers that already have it drop it), with a fresh round of retries.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from metering.errors import FieldError, MeteringError, not_found, validation_error
from metering.ids import IdKind, is_valid_id
from metering.keys import Principal
from metering.models.webhooks import MESSAGE_STATUSES
from metering.webhooks.endpoints import get_endpoint, require_admin

MAX_PAGE = 200
ATTEMPTS_SHOWN = 50  # per message, the latest


@dataclass(frozen=True, slots=True)
class AttemptView:
    attempt: int
    outcome: str
    started_at: datetime
    status_code: int | None
    latency_ms: int
    response_excerpt: str | None
    error: str | None


@dataclass(frozen=True, slots=True)
class DeliveryView:
    message_id: str
    type: str
    run: str | None
    status: str
    attempt_count: int
    next_attempt_at: datetime | None  # only while pending
    created_at: datetime
    finished_at: datetime | None
    attempts: list[AttemptView]


@dataclass(frozen=True, slots=True)
class DeliveryPage:
    deliveries: list[DeliveryView]
    next_cursor: str | None


def _encode_cursor(message_id: int) -> str:
    return base64.urlsafe_b64encode(f"m|{message_id}".encode()).decode()


def _decode_cursor(cursor: str | None) -> int | None:
    if not cursor:
        return None
    try:
        kind, number = base64.urlsafe_b64decode(cursor.encode()).decode().split("|")
        value = int(number)
        if kind != "m" or not 0 < value < 2**63:
            raise ValueError(cursor)
    except (ValueError, UnicodeError, binascii.Error):
        raise validation_error(
            [FieldError("$.cursor", "invalid_cursor", "use next_cursor from a previous page")]
        ) from None
    return value


MESSAGES = """
SELECT id, msg_id, type, subject, status, attempts,
       CASE WHEN status = 'pending' THEN next_attempt_at END, created_at, finished_at
FROM webhook_messages
WHERE endpoint_id = %(endpoint)s AND tenant_id = %(tenant)s
  AND (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(after)s::bigint IS NULL OR id < %(after)s)
ORDER BY id DESC
LIMIT %(limit)s
"""

ATTEMPTS = """
SELECT message_id, attempt, outcome, started_at, status_code, latency_ms, response_excerpt,
       error
FROM (
    SELECT a.*, row_number() OVER (PARTITION BY message_id ORDER BY attempt DESC) AS latest
    FROM webhook_attempts a WHERE message_id = ANY(%s)
) a
WHERE latest <= %s
ORDER BY message_id, attempt
"""


def deliveries(
    conn: psycopg.Connection[Any],
    principal: Principal,
    endpoint_id: str,
    *,
    status: str | None = None,
    cursor: str | None = None,
    limit: int = 50,
) -> DeliveryPage:
    """The endpoint's messages, newest first, each with its latest attempts."""
    get_endpoint(conn, principal, endpoint_id)
    if status is not None and status not in MESSAGE_STATUSES:
        raise validation_error(
            [FieldError("$.status", "invalid_value", f"one of {', '.join(MESSAGE_STATUSES)}")]
        )
    limit = max(1, min(limit, MAX_PAGE))
    rows = conn.execute(
        MESSAGES,
        {
            "endpoint": endpoint_id,
            "tenant": principal.tenant_id,
            "status": status,
            "after": _decode_cursor(cursor),
            "limit": limit + 1,
        },
    ).fetchall()
    more = len(rows) > limit
    rows = rows[:limit]
    attempts: dict[int, list[AttemptView]] = {}
    if rows:
        for a in conn.execute(ATTEMPTS, ([r[0] for r in rows], ATTEMPTS_SHOWN)).fetchall():
            attempts.setdefault(a[0], []).append(AttemptView(*a[1:]))
    return DeliveryPage(
        deliveries=[_delivery(r, attempts.get(r[0], [])) for r in rows],
        next_cursor=_encode_cursor(rows[-1][0]) if more else None,
    )


def _delivery(row: Sequence[Any], attempts: list[AttemptView]) -> DeliveryView:
    return DeliveryView(
        message_id=row[1],
        type=row[2],
        run=row[3],
        status=row[4],
        attempt_count=row[5],
        next_attempt_at=row[6],
        created_at=row[7],
        finished_at=row[8],
        attempts=attempts,
    )


def _endpoint_disabled(endpoint_id: str) -> MeteringError:
    return MeteringError(
        f"webhook endpoint {endpoint_id} is disabled: enable it first, then redeliver",
        code="endpoint_disabled",
        status=409,
        title="Conflict",
    )


REQUEUE = """
UPDATE webhook_messages
SET status = 'pending', tries = 0, next_attempt_at = %(now)s, finished_at = NULL
WHERE tenant_id = %(tenant)s AND endpoint_id = %(endpoint)s
"""


def redeliver_message(
    conn: psycopg.Connection[Any], principal: Principal, msg_id: str, now: datetime
) -> DeliveryView:
    """Queue one message again (same ``webhook-id``, same body); 404 for another tenant's."""
    require_admin(principal)
    row = (
        conn.execute(
            "SELECT endpoint_id FROM webhook_messages WHERE tenant_id = %s AND msg_id = %s "
            "FOR UPDATE",
            (principal.tenant_id, msg_id),
        ).fetchone()
        if is_valid_id(msg_id, IdKind.TENANT)
        else None
    )
    if row is None:
        raise not_found(f"no webhook message {msg_id}", code="message_not_found")
    endpoint = get_endpoint(conn, principal, row[0])
    if not endpoint.enabled:
        raise _endpoint_disabled(endpoint.id)
    conn.execute(
        REQUEUE + " AND msg_id = %(msg)s",
        {"now": now, "tenant": principal.tenant_id, "endpoint": endpoint.id, "msg": msg_id},
    )
    found = conn.execute(
        MESSAGES.replace("ORDER BY", "AND msg_id = %(msg)s ORDER BY"),
        {
            "endpoint": endpoint.id,
            "tenant": principal.tenant_id,
            "status": None,
            "after": None,
            "limit": 1,
            "msg": msg_id,
        },
    ).fetchone()
    assert found is not None
    return _delivery(found, [])


def redeliver_since(
    conn: psycopg.Connection[Any],
    principal: Principal,
    endpoint_id: str,
    since: datetime,
    now: datetime,
) -> int:
    """Queue again every message the endpoint was given since ``since``; how many."""
    endpoint = get_endpoint(conn, principal, endpoint_id, lock=True)
    if not endpoint.enabled:
        raise _endpoint_disabled(endpoint_id)
    return conn.execute(
        REQUEUE + " AND created_at >= %(since)s",
        {"now": now, "tenant": principal.tenant_id, "endpoint": endpoint_id, "since": since},
    ).rowcount
