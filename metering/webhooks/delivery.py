"""Delivering messages: claim with a lease, send outside any transaction, record the attempt.

Three short steps, as the Stripe pusher does (``metering/billing/claims.py``): a claim
transaction takes due messages and leases them (``claimed_until``), the HTTP request runs
with no transaction open, and each attempt is recorded in a transaction of its own. A
worker killed mid-request stops renewing its lease; the message is claimed again once the
lease runs out and sent again under the same ``webhook-id`` and body.

Order: of one run's messages for one endpoint only the earliest pending one is ever
claimed, so a ``run.resettled`` never overtakes its ``run.settled`` (it waits until that
one is delivered or has finally failed). Other runs and endpoints go on meanwhile.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg
from sqlalchemy.engine import Engine

from metering.config import Settings
from metering.db import raw_transaction
from metering.leases import Heartbeat
from metering.webhooks import breaker
from metering.webhooks.schedule import GiveUp, after_failure, disabled_reason, should_disable
from metering.webhooks.secrets import EndpointSeeds, signing_secrets
from metering.webhooks.signing import signature_headers
from metering.webhooks.slots import Held, SendSlots
from metering.webhooks.targets import UrlRefused, connection_for

EXCERPT_CHARS = 500
# Claims serialise on this transaction advisory lock: the head-of-line rule reads other
# rows' states, which two claims at once could each read before the other's lease.
CLAIM_LOCK_KEY = 0x3E6B_0016
# Delivery rounds take one of ``webhooks_delivery_rounds`` session advisory locks
# (ROUND_LOCK_KEY, slot): a round already running takes what became due as it goes, so
# more rounds at once would only hold more worker processes (settlement and fan-out wait
# for a free one) and contend for the claim lock.
ROUND_LOCK_KEY = 0x3E6B_0017
# While sends are in flight and none finishes, a round still claims what became due this
# often (a slow receiver must not hold up the next message's first attempt for long).
CLAIM_EVERY_S = 0.2
# Finished attempts are recorded once this many are waiting, or this long after the first.
RECORD_BATCH = 16
RECORD_EVERY_S = 0.05
# Messages one endpoint may hold claimed at once, per send slot it has: enough that one
# busy endpoint is claimed for in batches (each claim is a serial step of the round).
CLAIMS_PER_SLOT = 8


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


# The messages a claim may take: due, not leased, of an enabled endpoint, each the head of
# its (endpoint, run) line.
CLAIMABLE = """
    FROM webhook_messages m
    JOIN webhook_endpoints e ON e.id = m.endpoint_id
    WHERE m.status = 'pending' AND m.next_attempt_at <= %(now)s
      AND (m.claimed_until IS NULL OR m.claimed_until <= %(now)s)
      AND e.enabled AND (e.breaker_open_until IS NULL OR e.breaker_open_until <= %(now)s)
      AND (m.run_id IS NULL OR NOT EXISTS (
          SELECT 1 FROM webhook_messages p
          WHERE p.endpoint_id = m.endpoint_id AND p.run_id = m.run_id
            AND p.status = 'pending' AND p.notification_id < m.notification_id))
"""
# Claims per endpoint, each endpoint at most ``per_endpoint`` messages leased at once (its
# messages claimed and not yet recorded, by any round): a backlog at one endpoint cannot fill
# a claim and starve the others; its circuit breaker lowers that to one (half-open) or none
# (open), as ``breaker.allowance`` says. Endpoints are taken in turn (each one's longest due
# message, then each one's second, ...), so a long backlog at one endpoint never fills a
# claim that another's first message is waiting for. An endpoint gives at most ``limit`` (the claim takes no
# more), so its backlog is not read and probed whole for each claim; the picked messages are
# updated by an id array, not joined (a join hash-scanned every message ever stored).
CLAIM = """
WITH busy AS (
    SELECT endpoint_id, count(*) AS held FROM webhook_messages
    WHERE status = 'pending' AND claimed_until > %(now)s
    GROUP BY endpoint_id
), picked AS (
    SELECT c.id, c.next_attempt_at, c.turn
    FROM webhook_endpoints e
    LEFT JOIN busy b ON b.endpoint_id = e.id
    CROSS JOIN LATERAL (
        SELECT m.id, m.next_attempt_at,
               row_number() OVER (ORDER BY m.next_attempt_at, m.id) AS turn
        FROM webhook_messages m
        WHERE m.endpoint_id = e.id AND m.status = 'pending' AND m.next_attempt_at <= %(now)s
          AND (m.claimed_until IS NULL OR m.claimed_until <= %(now)s)
          AND (m.run_id IS NULL OR NOT EXISTS (
              SELECT 1 FROM webhook_messages p
              WHERE p.endpoint_id = m.endpoint_id AND p.run_id = m.run_id
                AND p.status = 'pending' AND p.notification_id < m.notification_id))
        ORDER BY m.next_attempt_at, m.id
        LIMIT least(greatest(
            CASE WHEN e.breaker_open_until > %(now)s THEN 0
                 WHEN e.breaker_failures >= %(half_open_after)s THEN 1
                 ELSE %(per_endpoint)s END - coalesce(b.held, 0), 0), %(limit)s)
    ) c
    WHERE e.enabled
    ORDER BY c.turn, c.next_attempt_at, c.id
    LIMIT %(limit)s
)
UPDATE webhook_messages m
SET claimed_until = %(until)s, attempts = m.attempts + 1, tries = m.tries + 1
FROM webhook_endpoints e
WHERE m.id = ANY(ARRAY(SELECT id FROM picked)) AND e.id = m.endpoint_id
RETURNING m.id, m.msg_id, m.attempts, m.tries, m.payload, e.id, e.url, e.secret_seed,
          e.previous_secret_seed, e.previous_seed_expires_at
"""


def claim(
    conn: psycopg.Connection[Any],
    now: datetime,
    limit: int,
    lease: timedelta,
    per_endpoint: int = 1_000_000,
) -> list[Claimed]:
    """Lease up to ``limit`` due messages, each the head of its (endpoint, run) line, of
    enabled endpoints, no endpoint above ``per_endpoint`` leased at once (or its breaker's
    allowance), the longest due first."""
    if limit <= 0:
        return []
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (CLAIM_LOCK_KEY,))
    rows = conn.execute(
        CLAIM,
        {
            "now": now,
            "limit": limit,
            "until": now + lease,
            "per_endpoint": per_endpoint,
            "half_open_after": breaker.HALF_OPEN_AFTER,
        },
    ).fetchall()
    return [
        Claimed(r[0], r[1], r[2], r[3], r[4], r[5], r[6], EndpointSeeds(r[7], r[8], r[9]))
        for r in rows
    ]


def has_due(conn: psycopg.Connection[Any], now: datetime) -> bool:
    """Whether a claim made now would take anything (a message waiting behind its run's
    earlier one, or for its next retry, does not count)."""
    row = conn.execute(f"SELECT EXISTS (SELECT 1 {CLAIMABLE})", {"now": now}).fetchone()
    return bool(row and row[0])


RELEASE = """
UPDATE webhook_messages m
SET claimed_until = NULL, attempts = m.attempts - 1, tries = greatest(m.tries - 1, 0)
FROM unnest(%s::bigint[], %s::int[]) AS h(id, attempt)
WHERE m.id = h.id AND m.attempts = h.attempt AND m.status = 'pending'
"""


def release(conn: psycopg.Connection[Any], messages: Sequence[Claimed]) -> int:
    """Let go of claimed messages that were never sent, as if they had never been claimed
    (the claim's ``attempts`` and ``tries`` given back, the lease ended: due at once to
    any round); one another sender has claimed since is left alone. How many were let go."""
    if not messages:
        return 0
    ordered = sorted(messages, key=lambda m: m.id)
    return conn.execute(RELEASE, ([m.id for m in ordered], [m.attempt for m in ordered])).rowcount


RENEW = """
UPDATE webhook_messages SET claimed_until = %(until)s
WHERE id IN (
    SELECT m.id FROM webhook_messages m
    JOIN unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS h(id, attempt)
      ON h.id = m.id AND h.attempt = m.attempts
    WHERE m.status = 'pending' AND m.claimed_until IS NOT NULL
    ORDER BY m.id FOR UPDATE OF m SKIP LOCKED
)
"""


def renew(conn: psycopg.Connection[Any], held: Sequence[tuple[int, int]], until: datetime) -> None:
    """Extend the lease on the (message, attempt) pairs a live sender still holds; a pair
    already recorded, or claimed again by another sender, is left alone."""
    if held:
        conn.execute(
            RENEW,
            {"ids": [h[0] for h in held], "attempts": [h[1] for h in held], "until": until},
        )


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


def deliver_due(
    engine: Engine, settings: Settings, send: Send, clock: Callable[[], datetime]
) -> int:
    """Claim and send due messages, ``webhooks_delivery_threads`` at a time and at most
    ``webhooks_endpoint_concurrency`` to one endpoint (fewer while its breaker is not
    closed), until nothing is due or ``webhooks_round_s`` has passed; messages attempted.

    The sends run in the pool; claiming and recording stay in this thread, each a serial
    step done for many messages at once. Claims are made ahead, up to
    ``webhooks_delivery_batch`` held at once (and eight times its send share per
    endpoint), whenever fewer than ``webhooks_delivery_threads`` are being sent or could
    be; a message claimed ahead waits for a send slot of its endpoint under the round's
    lease, renewed by its heartbeat. The attempts that finished together are recorded in
    one transaction (a worker killed before the commit sends them again under the same
    ``webhook-id``, which at-least-once allows).

    Fair share: a message claimed ahead is let go (:func:`release`) as soon as it could
    only wait: its endpoint's attempt failed (the breaker now says how many it may have),
    or the deadline came. Past the deadline the round claims nothing ahead, only what
    its endpoints' send shares can start at once, and only while its sends run (at most
    one ``webhooks_timeout_s`` more): a hanging receiver's sends keep the round's worker
    process, never the other endpoints' messages.
    """
    lease = timedelta(seconds=settings.webhooks_lease_s)
    threads = max(1, settings.webhooks_delivery_threads)
    per_endpoint = max(1, min(settings.webhooks_endpoint_concurrency, threads))
    deadline = time.monotonic() + settings.webhooks_round_s
    tail_end = deadline + settings.webhooks_timeout_s
    held = Held()
    slots = SendSlots(threads, per_endpoint)
    sent = 0

    def renew_held(until: datetime) -> None:
        with raw_transaction(engine) as conn:
            renew(conn, held.pairs(), until)

    def one(message: Claimed) -> tuple[Claimed, Attempt]:
        return message, attempt(message, settings, send, clock)

    def let_go(messages: list[Claimed]) -> None:
        nonlocal sent
        if messages:
            for message in messages:
                held.drop(message)
            with raw_transaction(engine) as conn:
                release(conn, messages)
            sent -= len(messages)

    def claim_now(ahead: bool) -> int:
        nonlocal sent
        if ahead:
            wanted = max(threads - slots.busy, settings.webhooks_delivery_batch - slots.held)
        else:
            wanted = threads - slots.busy
        cap = per_endpoint * CLAIMS_PER_SLOT if ahead else per_endpoint
        with raw_transaction(engine) as conn:
            claimed = claim(conn, clock(), wanted, lease, cap)
        held.add(claimed)
        slots.add(claimed)
        sent += len(claimed)
        return wanted - len(claimed)

    recorder = _Recorder(engine, settings, held)
    heartbeat = Heartbeat(renew_held, lease, clock, name="webhooks", written_at=time.monotonic())
    with heartbeat, ThreadPoolExecutor(threads, thread_name_prefix="webhook") as pool:
        # After a claim that found less than it asked for, the next waits until an
        # endpoint's queue drains or CLAIM_EVERY_S passes: claiming at every finished
        # send cost more than sending.
        short_at: float | None = None
        while True:
            at = time.monotonic()
            ahead = at < deadline
            if not ahead:
                let_go(slots.take_waiting())
            may_claim = ahead or (bool(slots.running) and at < tail_end)
            worth_it = short_at is None or slots.drained or at - short_at >= CLAIM_EVERY_S
            if may_claim and worth_it and slots.busy < threads:
                short_at = time.monotonic() if claim_now(ahead) > 0 else None
                slots.drained = False
            slots.start(pool, one)
            if not ahead:  # what could not start at once is let go, not held
                let_go(slots.take_waiting())
            if not slots.running:
                recorder.flush()
                return sent
            finished, slots.running = wait(
                slots.running,
                timeout=RECORD_EVERY_S if recorder.pending else CLAIM_EVERY_S,
                return_when=FIRST_COMPLETED,
            )
            attempts = [future.result() for future in finished]
            slots.finished(attempts)  # their send slots are free at once
            if recorder.add(attempts):
                let_go(slots.take_waiting(recorder.tripped()))


class _Recorder:
    """Finished attempts, recorded together a few at a time or after RECORD_EVERY_S (one
    transaction per finished send was the round's serial bottleneck): the delivered ones
    by :func:`record_delivered`, the others one by one by :func:`record`."""

    def __init__(self, engine: Engine, settings: Settings, held: Held) -> None:
        self._engine = engine
        self._settings = settings
        self._held = held
        self._unrecorded: list[tuple[Claimed, Attempt]] = []
        self._first_at = 0.0
        self._tripped: set[str] = set()

    @property
    def pending(self) -> bool:
        return bool(self._unrecorded)

    def add(self, attempts: list[tuple[Claimed, Attempt]]) -> bool:
        """Keep the attempts; record them all when it is time. Whether it was."""
        if attempts and not self._unrecorded:
            self._first_at = time.monotonic()
        self._unrecorded.extend(attempts)
        if self._unrecorded and (
            len(self._unrecorded) >= RECORD_BATCH
            or time.monotonic() - self._first_at >= RECORD_EVERY_S
        ):
            self.flush()
            return True
        return False

    def tripped(self) -> set[str]:
        """The endpoints whose attempts failed in the last records: their breakers count."""
        tripped, self._tripped = self._tripped, set()
        return tripped

    def flush(self) -> None:
        done = self._unrecorded
        if not done:
            return
        with raw_transaction(self._engine) as conn:
            record_delivered(conn, [a for a in done if a[1].delivered])
            for message, result in done:
                if not result.delivered:
                    record(conn, message, result, self._settings)
        for message, result in done:
            self._held.drop(message)
            if not result.delivered and breaker.trips(result.status_code, result.error):
                self._tripped.add(message.endpoint_id)
        self._unrecorded = []


@contextmanager
def round_slot(engine: Engine, slots: int) -> Iterator[bool]:
    """Hold one of ``slots`` delivery-round locks for the block; ``False`` when all are
    held by other rounds. A session lock on a connection kept out of the pool meanwhile,
    in autocommit (no transaction stays open for the round): a worker that dies mid-round
    drops its connection and with it the lock."""
    raw = engine.raw_connection()
    clean = False  # lock let go and autocommit off again: the connection may be pooled
    try:
        driver = raw.driver_connection
        assert isinstance(driver, psycopg.Connection)
        driver.autocommit = True
        held: int | None = None
        for slot in range(max(1, slots)):
            row = driver.execute(
                "SELECT pg_try_advisory_lock(%s, %s)", (ROUND_LOCK_KEY, slot)
            ).fetchone()
            if row and row[0]:
                held = slot
                break
        yield held is not None
        if held is not None:
            driver.execute("SELECT pg_advisory_unlock(%s, %s)", (ROUND_LOCK_KEY, held))
        driver.autocommit = False
        clean = True
    finally:
        if not clean:  # closing the session is what surely lets go of its lock
            raw.invalidate()
        raw.close()


@dataclass(frozen=True, slots=True)
class Round:
    sent: int  # messages attempted, 0 when it did not run
    ran: bool  # False: every round slot was taken, another round delivers
    more_due: bool  # after the round let go of its slot, something was due: kick again


def deliver_in_turn(
    engine: Engine, settings: Settings, send: Send, clock: Callable[[], datetime]
) -> Round:
    """A delivery round if a slot is free, then a look for what became due meanwhile.

    The look comes after the slot is let go, so a message made while the round was ending
    is either claimed by that round, or seen here (its kick found the slot taken and left),
    or kicks a round that finds the slot free. A round that found no slot does not look:
    the round holding it will."""
    with round_slot(engine, settings.webhooks_delivery_rounds) as ran:
        sent = deliver_due(engine, settings, send, clock) if ran else 0
    if not ran:
        return Round(0, ran=False, more_due=False)
    with raw_transaction(engine) as conn:
        more = has_due(conn, clock())
    return Round(sent, ran=True, more_due=more)
