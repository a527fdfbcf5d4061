"""One attempt at a message, and recording how it went: the message delivered, retried or
failed, the endpoint's failure streak and circuit breaker, disabling it once it has failed
long enough. The claim and the round around them are ``metering/webhooks/delivery.py``.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from metering.config import Settings
from metering.webhooks import breaker
from metering.webhooks.schedule import GiveUp, after_failure, disabled_reason, should_disable
from metering.webhooks.secrets import EndpointSeeds, signing_secrets
from metering.webhooks.signing import signature_headers
from metering.webhooks.targets import UrlRefused, connection_for

EXCERPT_CHARS = 500


@dataclass(frozen=True, slots=True)
class Claimed:
    id: int
    msg_id: str
    attempt: int  # this attempt's number among all of the message's attempts
    tries: int  # its number in the current round of retries
    payload: str
    endpoint_id: str
    url: str
    seeds: EndpointSeeds


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One signed request, aimed at the address the SSRF check passed."""

    url: str
    headers: dict[str, str]
    body: bytes
    timeout_s: float
    server_name: str | None  # the TLS name when ``url`` names an address


@dataclass(frozen=True, slots=True)
class Reply:
    """What came back: a status and the start of the body, or why nothing did."""

    status_code: int | None
    text: str = ""
    error: str | None = None


Send = Callable[[Outgoing], Reply]


@dataclass(frozen=True, slots=True)
class Attempt:
    started_at: datetime
    delivered: bool
    status_code: int | None
    latency_ms: int
    excerpt: str | None
    error: str | None


def attempt(
    message: Claimed, settings: Settings, send: Send, clock: Callable[[], datetime]
) -> Attempt:
    """Check the target, sign, send: one attempt, never raising for the receiver's faults."""
    started = clock()
    began = time.monotonic()

    def done(status: int | None, text: str = "", error: str | None = None) -> Attempt:
        elapsed = int((time.monotonic() - began) * 1000)
        delivered = status is not None and 200 <= status < 300
        excerpt = text[:EXCERPT_CHARS] if text else None
        return Attempt(started, delivered, status, elapsed, excerpt, error)

    try:
        target = connection_for(message.url, allow_private=settings.webhooks_allow_private)
    except UrlRefused as refused:
        return done(None, error=f"refused: {refused.message}")
    except (OSError, UnicodeError) as exc:
        return done(None, error=f"cannot resolve the host: {exc}")
    secrets = signing_secrets(message.seeds, settings.key_pepper, started)
    body = message.payload.encode()
    headers = signature_headers(message.msg_id, body, secrets, started)
    headers["user-agent"] = "Fairmeter-Webhooks/1"
    if target.host_header is not None:
        headers["host"] = target.host_header
    reply = send(
        Outgoing(target.url, headers, body, settings.webhooks_timeout_s, target.server_name)
    )
    return done(reply.status_code, reply.text, reply.error)


def record(
    conn: psycopg.Connection[Any],
    message: Claimed,
    result: Attempt,
    settings: Settings,
    draw: Callable[[], float] = random.random,
) -> bool:
    """Store the attempt and its consequence: delivered, retried later, or failed; the
    endpoint's failure streak, and disabling it once it has failed long enough. ``False``
    when the message was no longer this sender's (its lease ran out and another took it):
    the attempt is kept in the log, its consequence is the other sender's to record."""
    # The endpoint (and with it the message) may have been deleted meanwhile: nothing to log.
    conn.execute(
        """
        INSERT INTO webhook_attempts (tenant_id, message_id, attempt, outcome, started_at,
                                      status_code, latency_ms, response_excerpt, error)
        SELECT tenant_id, id, %s, %s, %s, %s, %s, %s, %s FROM webhook_messages WHERE id = %s
        ON CONFLICT (message_id, attempt, tenant_id) DO NOTHING
        """,
        (
            message.attempt,
            "delivered" if result.delivered else "failed",
            result.started_at,
            result.status_code,
            result.latency_ms,
            result.excerpt[:EXCERPT_CHARS] if result.excerpt else None,
            result.error,
            message.id,
        ),
    )
    now = result.started_at
    if result.delivered:
        status, next_at, finished = "delivered", None, now
    else:
        outcome = after_failure(message.tries, now, settings.webhooks_retry_schedule_s, draw)
        if isinstance(outcome, GiveUp):
            status, next_at, finished = "failed", None, now
        else:
            status, next_at, finished = "pending", outcome.at, None
    updated = conn.execute(
        """
        UPDATE webhook_messages
        SET status = %s, next_attempt_at = coalesce(%s, next_attempt_at), finished_at = %s,
            claimed_until = NULL
        WHERE id = %s AND attempts = %s AND status = 'pending'
        """,
        (status, next_at, finished, message.id, message.attempt),
    ).rowcount
    _endpoint_health(conn, message.endpoint_id, result, settings)
    return updated == 1


RECORD_DELIVERED_ATTEMPTS = """
INSERT INTO webhook_attempts (tenant_id, message_id, attempt, outcome, started_at,
                              status_code, latency_ms, response_excerpt)
SELECT m.tenant_id, m.id, x.attempt, 'delivered', x.started_at, x.status_code, x.latency_ms,
       x.excerpt
FROM unnest(%s::bigint[], %s::int[], %s::timestamptz[], %s::int[], %s::int[], %s::text[])
     AS x(id, attempt, started_at, status_code, latency_ms, excerpt)
JOIN webhook_messages m ON m.id = x.id
ORDER BY m.id
ON CONFLICT (message_id, attempt, tenant_id) DO NOTHING
"""
RECORD_DELIVERED_MESSAGES = """
UPDATE webhook_messages m
SET status = 'delivered', finished_at = x.started_at, claimed_until = NULL
FROM unnest(%s::bigint[], %s::int[], %s::timestamptz[]) AS x(id, attempt, started_at)
WHERE m.id = x.id AND m.attempts = x.attempt AND m.status = 'pending'
"""


def record_delivered(conn: psycopg.Connection[Any], done: Sequence[tuple[Claimed, Attempt]]) -> int:
    """:func:`record` for many delivered attempts at once, in three statements (recording
    each with three of its own was the serial step a round spent most of its time in):
    the attempts logged, the messages delivered unless another sender has them now, their
    endpoints' failure streaks ended. How many were still this sender's."""
    assert all(result.delivered for _, result in done)
    if not done:
        return 0
    done = sorted(done, key=lambda pair: pair[0].id)
    ids = [m.id for m, _ in done]
    attempts = [m.attempt for m, _ in done]
    started = [r.started_at for _, r in done]
    conn.execute(
        RECORD_DELIVERED_ATTEMPTS,
        (
            ids,
            attempts,
            started,
            [r.status_code for _, r in done],
            [r.latency_ms for _, r in done],
            [r.excerpt[:EXCERPT_CHARS] if r.excerpt else None for _, r in done],
        ),
    )
    updated = conn.execute(RECORD_DELIVERED_MESSAGES, (ids, attempts, started)).rowcount
    conn.execute(
        f"UPDATE webhook_endpoints SET {HEALTHY} "
        "WHERE id = ANY(%s) AND (failing_since IS NOT NULL OR breaker_failures > 0)",
        (sorted({m.endpoint_id for m, _ in done}),),
    )
    return updated


# An answered attempt: the failure streak is over, the breaker closed.
HEALTHY = "failing_since = NULL, breaker_failures = 0, breaker_open_until = NULL"


def _endpoint_health(
    conn: psycopg.Connection[Any], endpoint_id: str, result: Attempt, settings: Settings
) -> None:
    if result.delivered:
        conn.execute(
            f"UPDATE webhook_endpoints SET {HEALTHY} "
            "WHERE id = %s AND (failing_since IS NOT NULL OR breaker_failures > 0)",
            (endpoint_id,),
        )
        return
    if breaker.trips(result.status_code, result.error):
        _trip(conn, endpoint_id, result.started_at, settings)
    else:  # it answered (a 4xx): the breaker closes, the failure streak goes on
        conn.execute(
            "UPDATE webhook_endpoints SET breaker_failures = 0, breaker_open_until = NULL "
            "WHERE id = %s AND breaker_failures > 0",
            (endpoint_id,),
        )
    row = conn.execute(
        "UPDATE webhook_endpoints SET failing_since = coalesce(failing_since, %s) "
        "WHERE id = %s RETURNING failing_since, enabled",
        (result.started_at, endpoint_id),
    ).fetchone()
    if row is None or not row[1]:
        return
    failing_since = row[0]
    if should_disable(failing_since, result.started_at, settings.webhooks_disable_after_s):
        conn.execute(
            "UPDATE webhook_endpoints SET enabled = false, disabled_reason = %s, "
            "disabled_at = %s, updated_at = now() WHERE id = %s",
            (disabled_reason(failing_since, result.started_at), result.started_at, endpoint_id),
        )


def _trip(
    conn: psycopg.Connection[Any], endpoint_id: str, now: datetime, settings: Settings
) -> None:
    """One more failure in a row for the endpoint's breaker, which may open it."""
    row = conn.execute(
        "SELECT breaker_failures, breaker_open_until FROM webhook_endpoints WHERE id = %s "
        "FOR UPDATE",
        (endpoint_id,),
    ).fetchone()
    if row is None:
        return
    after = breaker.after_attempt(
        breaker.Breaker(row[0], row[1]),
        tripped=True,
        now=now,
        pause_s=settings.webhooks_breaker_pause_s,
        max_pause_s=settings.webhooks_breaker_max_pause_s,
    )
    conn.execute(
        "UPDATE webhook_endpoints SET breaker_failures = %s, breaker_open_until = %s WHERE id = %s",
        (after.failures, after.open_until, endpoint_id),
    )
