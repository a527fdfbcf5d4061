"""Claiming due outbox rows for a push round: one sender per customer at a time (the rule
is in docs/stripe.md, "One sender per customer").

A claim takes a lease on each customer it picks (``stripe_customer_leases``) and claims
that customer's due rows; customers whose lease is in force are skipped. The lease is the
rule, not the rows: it is held from planning until the pusher has recorded every result of
the customer's calls, whatever the rows' status meanwhile. A correction settled while a
call is in flight supersedes the row being sent; counting only pending rows as busy, a
second pusher planned the correction without that call and Stripe billed both (issue #29).
Claims serialise on a transaction advisory lock and take the customers waiting longest
first. The lease is short and the pusher renews it while its round lasts
(``metering/leases.py``), so a killed pusher's customers wait one short lease (#13 §7).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import psycopg

from metering.billing.outbox import OutboxItem
from metering.billing.plan import Step

# Serialises claims, so two pushers never take the lease of one customer at once (Stripe
# allows one concurrent meter-event call per customer and meter).
CLAIM_LOCK_KEY = 0x5717_BE00
ALL_CUSTOMERS = 2**31 - 1
CLAIM_SCAN_FACTOR = 4
# The leases in force are few (the customers being sent right now: a holder deletes its
# lease when done) and read whole; the due rows are read through the due index of pending
# rows in order, only as far as the LIMIT. Neither grows with the backlog.
CLAIM = """
WITH busy AS MATERIALIZED (
    SELECT tenant_id, customer_id FROM stripe_customer_leases WHERE held_until > %(now)s
), due AS (
    SELECT o.id, o.tenant_id, o.customer_id FROM stripe_outbox o
    WHERE o.status = 'pending' AND o.next_attempt_at <= %(now)s
      AND NOT EXISTS (SELECT 1 FROM busy b WHERE b.tenant_id = o.tenant_id
                                             AND b.customer_id = o.customer_id)
    ORDER BY o.next_attempt_at, o.id  -- the due index's order: ties of one chunk by id
    LIMIT %(scan)s
), firsts AS (
    SELECT id, tenant_id, customer_id,
           min(id) OVER (PARTITION BY tenant_id, customer_id) AS first_id FROM due
), ranked AS (  -- customers numbered by their oldest due row: window sorts, no join
    SELECT id, tenant_id, customer_id,
           dense_rank() OVER (ORDER BY first_id) AS customer_rank FROM firsts
), picked AS (
    SELECT id, tenant_id, customer_id FROM ranked
    WHERE customer_rank <= %(customers)s
    ORDER BY id LIMIT %(limit)s
), leased AS (  -- absent or lapsed only (re-checked on the latest version of a lease row)
    INSERT INTO stripe_customer_leases AS l (tenant_id, customer_id, holder, held_until)
    SELECT DISTINCT tenant_id, customer_id, %(holder)s, %(until)s FROM picked
    ORDER BY tenant_id, customer_id
    ON CONFLICT (tenant_id, customer_id) DO UPDATE
    SET holder = EXCLUDED.holder, held_until = EXCLUDED.held_until
    WHERE l.held_until <= %(now)s
    RETURNING l.tenant_id, l.customer_id
)
UPDATE stripe_outbox o SET claimed_until = %(until)s,
    first_attempt_at = COALESCE(o.first_attempt_at, %(now)s)  -- retries stay inside Stripe's window
FROM picked
JOIN leased ON leased.tenant_id = picked.tenant_id AND leased.customer_id = picked.customer_id
JOIN customers c ON c.tenant_id = picked.tenant_id AND c.id = picked.customer_id
WHERE o.id = picked.id
  AND o.status = 'pending'  -- re-checked after waiting on a row lock (an error report's)
RETURNING o.id, o.tenant_id, o.customer_id, c.stripe_customer_id, o.run_id,
          o.decision_version, o.target_billed_micros, o.period, o.event_timestamp,
          o.plan, o.next_step, o.attempts, o.generation, o.first_attempt_at
"""
# A customer leased whose every picked row changed status meanwhile (an error report's
# writes, waited for) has nothing to send: its lease goes at once, not after the round.
UNUSED = """
DELETE FROM stripe_customer_leases l WHERE l.holder = %(holder)s
  AND NOT EXISTS (SELECT 1 FROM unnest(%(tenants)s::text[], %(customers)s::text[]) AS u(t, c)
                  WHERE u.t = l.tenant_id AND u.c = l.customer_id)
"""


def claim(
    conn: psycopg.Connection[Any],
    now: datetime,
    limit: int,
    lease: timedelta,
    max_customers: int | None = None,
    *,
    holder: str,
) -> list[OutboxItem]:
    """Lease customers no other pusher holds, for ``holder`` (one round), and claim their
    due rows; a customer's rows in id order. The holder renews the leases (``renew``) and
    releases each customer once its results are recorded (``release``).

    At most ``max_customers`` customers (those waiting longest) per claim, so concurrent
    pushers split the customers between them instead of one taking a few rows of every
    customer and leaving the others nothing to do until it finishes. The claim looks at
    the ``CLAIM_SCAN_FACTOR × limit`` rows due longest, through the due index, so its cost
    does not grow with the backlog (a Stripe outage can leave hundreds of thousands of rows
    pending); the rest are claimed by later rounds."""
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (CLAIM_LOCK_KEY,))
    rows = conn.execute(
        CLAIM,
        {
            "now": now,
            "limit": limit,
            "scan": CLAIM_SCAN_FACTOR * limit,
            "until": now + lease,
            "holder": holder,
            "customers": ALL_CUSTOMERS if max_customers is None else max_customers,
        },
    ).fetchall()
    items = sorted((_item(r) for r in rows), key=lambda i: i.id)
    conn.execute(
        UNUSED,
        {
            "holder": holder,
            "tenants": [i.tenant_id for i in items],
            "customers": [i.customer_id for i in items],
        },
    )
    return items


def _item(r: Any) -> OutboxItem:
    return OutboxItem(
        id=r[0],
        tenant_id=r[1],
        customer_id=r[2],
        stripe_customer_id=r[3],
        run_id=r[4],
        version=r[5],
        target_micros=r[6],
        period=r[7],
        event_timestamp=r[8],
        plan=[Step.from_json(s) for s in r[9]] if r[9] is not None else None,
        next_step=r[10],
        attempts=r[11],
        generation=r[12],
        first_attempt_at=r[13],
    )


# Rows the round released (sent, rescheduled, dead, deferred) have no claim and stay free.
# A row the round is writing right now (recording a result, deferring it behind a failed
# row) is skipped, not waited for: the renewal runs beside the round's own transactions, and
# waiting on them in another row order deadlocked (a 2,000-run push with 30 % faults did).
# That write releases or reschedules the row anyway; a skipped live row is renewed next beat.
# The holder's leases likewise: one locked by an error report's check is renewed next beat.
RENEW = """
WITH rows AS (
    UPDATE stripe_outbox SET claimed_until = %(until)s
    WHERE id IN (
        SELECT id FROM stripe_outbox
        WHERE id = ANY(%(ids)s) AND status = 'pending' AND claimed_until IS NOT NULL
        ORDER BY id FOR UPDATE SKIP LOCKED
    )
)
UPDATE stripe_customer_leases SET held_until = %(until)s
WHERE (tenant_id, customer_id) IN (
    SELECT tenant_id, customer_id FROM stripe_customer_leases WHERE holder = %(holder)s
    ORDER BY tenant_id, customer_id FOR UPDATE SKIP LOCKED
)
RETURNING tenant_id, customer_id
"""


def renew(
    conn: psycopg.Connection[Any],
    holder: str,
    ids: list[int],
    until: datetime,
    customers: set[tuple[str, str]],
) -> set[tuple[str, str]]:
    """Extend a live pusher's leases and its claim on ``ids`` (the rows it still holds).
    Returns which of ``customers`` (those it still sends for) it no longer holds: a lease
    that lapsed and was taken over renews nothing, and a row being written right now is
    skipped (reported too: stopping early is the safe side)."""
    renewed = conn.execute(RENEW, {"holder": holder, "ids": ids, "until": until}).fetchall()
    return customers - {(t, c) for t, c in renewed}


def release(conn: psycopg.Connection[Any], holder: str, tenant: str, customer: str) -> None:
    """``holder`` is done with the customer: every result of its calls is recorded. A lease
    that lapsed and was taken over is the new holder's, and stays."""
    conn.execute(
        "DELETE FROM stripe_customer_leases "
        "WHERE tenant_id = %s AND customer_id = %s AND holder = %s",
        (tenant, customer, holder),
    )
