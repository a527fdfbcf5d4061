"""Delivering messages: claim with a lease, send outside any transaction, record the attempt.

Three short steps, as the Stripe pusher does (``metering/billing/claims.py``): a claim
transaction takes due messages and leases them (``claimed_until``), the HTTP request runs
with no transaction open, and each attempt is recorded in a transaction of its own. A
worker killed mid-request stops renewing its lease; the message is claimed again once the
lease runs out and sent again under the same ``webhook-id`` and body.

Order: of one run's messages for one endpoint only the earliest pending one is ever
claimed, so a ``run.resettled`` never overtakes its ``run.settled`` (it waits until that
one is delivered or has finally failed). Other runs and endpoints go on meanwhile.

Fair share (docs/webhooks.md, "Fair share"): a claim takes endpoints in turn; an endpoint
has at most its send share at once, and its circuit breaker (``breaker.py``) lowers that to
one probe or none while it fails; a round keeps a quarter of its threads for endpoints with
no send running (``slots.py``). A round never holds a message it cannot send now: what it
claimed ahead is let go when its endpoint fails and at the deadline. Its tail (the sends
still running at the deadline, at most one timeout long) would otherwise keep every other
endpoint's new messages waiting, since a second round would need a second worker process
(settlement needs one too, and a worker may run only two): so, rather than raising
``webhooks_delivery_rounds`` or giving up the round slot while its own sends still run,
the round goes on claiming during its tail, but only what can be sent at once (each
endpoint's send share, nothing ahead, nothing for an endpoint whose last attempt failed),
and stops at one timeout past the deadline.
"""

from __future__ import annotations

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
from metering.webhooks.attempts import (
    Attempt,
    Claimed,
    Outgoing,
    Reply,
    Send,
    attempt,
    record,
    record_delivered,
)
from metering.webhooks.secrets import EndpointSeeds
from metering.webhooks.slots import RECORD_EVERY_S, Held, Recorder, SendSlots

# Where the sending step's parts were before they had a module of their own.
__all__ = [
    "Attempt",
    "Claimed",
    "Outgoing",
    "Reply",
    "Send",
    "attempt",
    "claim",
    "deliver_due",
    "deliver_in_turn",
    "has_due",
    "record",
    "record_delivered",
    "release",
    "renew",
    "round_slot",
]

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
# Messages one endpoint may hold claimed at once, per send slot it has: enough that one
# busy endpoint is claimed for in batches (each claim is a serial step of the round).
CLAIMS_PER_SLOT = 8


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
# claim that another's first message is waiting for. An endpoint gives at most ``limit``
# (the claim takes no more), so its backlog is not read and probed whole for each claim;
# the picked messages are updated by an id array, not joined (a join hash-scanned every
# message ever stored).
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
                 WHEN e.breaker_failures > 0 AND NOT %(probes)s THEN 0
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
    *,
    probes: bool = True,
) -> list[Claimed]:
    """Lease up to ``limit`` due messages, each the head of its (endpoint, run) line, of
    enabled endpoints, no endpoint above ``per_endpoint`` leased at once (or its breaker's
    allowance), endpoints in turn, the longest due first. ``probes=False``: nothing for an
    endpoint whose last attempt failed (its next may hang for the whole timeout)."""
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
            "probes": probes,
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
    its endpoints' send shares can start at once, for endpoints whose last attempt did not
    fail,
    and only while its sends run, at most one ``webhooks_timeout_s`` more (so a round lasts
    at most its deadline and two timeouts): a hanging receiver's sends keep the round's
    worker process, never the other endpoints' messages.
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

    def let_go(messages: list[Claimed]) -> bool:
        nonlocal sent
        if messages:
            for message in messages:
                held.drop(message)
            with raw_transaction(engine) as conn:
                release(conn, messages)
            sent -= len(messages)
        return bool(messages)

    def claim_now(ahead: bool) -> int:
        nonlocal sent
        if ahead:
            wanted = max(threads - slots.busy, settings.webhooks_delivery_batch - slots.held)
        else:
            wanted = threads - slots.busy
        cap = per_endpoint * CLAIMS_PER_SLOT if ahead else per_endpoint
        with raw_transaction(engine) as conn:
            # The tail sends nothing to an endpoint that just failed: a send to a hanging
            # receiver would keep the round (and every other endpoint's next messages) a
            # whole timeout longer.
            claimed = claim(conn, clock(), wanted, lease, cap, probes=ahead)
        held.add(claimed)
        slots.add(claimed)
        sent += len(claimed)
        return wanted - len(claimed)

    recorder = Recorder(engine, settings, held)
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
            # What could not start at once is let go, not held (and not claimed again
            # before CLAIM_EVERY_S).
            if not ahead and let_go(slots.take_waiting()):
                short_at = time.monotonic()
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
