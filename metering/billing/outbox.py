"""The Stripe outbox's storage: written by settlement, claimed and advanced by the pusher."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import psycopg
from psycopg.types.json import Jsonb

from metering.billing.plan import Carry, Sent, Step

# Serialises claims, so two pushers never hold rows of the same customer at once (Stripe
# allows one concurrent meter-event call per customer and meter).
CLAIM_LOCK_KEY = 0x5717_BE00


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """A decision that changes what the customer is billed, to be sent to Stripe."""

    tenant_id: str
    customer_id: str
    run_id: int
    decision_version: int
    target_billed_micros: int
    period: str
    event_timestamp: datetime


def enqueue(conn: psycopg.Connection[Any], rows: Sequence[OutboxRow]) -> None:
    """Written in the settlement transaction. Older unsent versions of the same run are
    superseded: the newest plan is computed from what Stripe actually received.

    A run's first decision cannot have older rows, so only re-decided runs are looked up
    (most of a sweep is first decisions; the lookup was ~11 µs of PostgreSQL per run).
    """
    if not rows:
        return
    redecided = [r.run_id for r in rows if r.decision_version > 1]
    if redecided:
        conn.execute(
            """
            UPDATE stripe_outbox SET status = 'superseded', claimed_until = NULL
            WHERE run_id = ANY(%(runs)s) AND status IN ('pending', 'waiting_customer')
            """,
            {"runs": redecided},
        )
    # One JSON document, not an array per column (see ``repo.as_json``).
    conn.execute(
        """
        INSERT INTO stripe_outbox (tenant_id, customer_id, run_id, decision_version,
            target_billed_micros, period, event_timestamp, status)
        SELECT u.tenant_id, u.customer_id, u.run_id, u.decision_version,
               u.target_billed_micros, u.period, u.event_timestamp,
               CASE WHEN cu.stripe_customer_id IS NULL THEN 'waiting_customer' ELSE 'pending' END
        FROM json_to_recordset(%(rows)s::json)
             AS u(tenant_id text, customer_id text, run_id bigint, decision_version int,
                  target_billed_micros bigint, period text, event_timestamp timestamptz)
        JOIN customers cu ON cu.tenant_id = u.tenant_id AND cu.id = u.customer_id
        ON CONFLICT (run_id, decision_version) DO NOTHING
        """,
        {"rows": msgspec.json.encode(rows).decode()},
    )


@dataclass(frozen=True, slots=True)
class OutboxItem:
    id: int
    tenant_id: str
    customer_id: str
    stripe_customer_id: str
    run_id: int
    version: int
    target_micros: int
    period: str
    event_timestamp: datetime
    plan: list[Step] | None
    next_step: int
    attempts: int


def claim(
    conn: psycopg.Connection[Any], now: datetime, limit: int, lease: timedelta
) -> list[OutboxItem]:
    """Claim due rows of customers no other pusher holds; a customer's rows in id order."""
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (CLAIM_LOCK_KEY,))
    rows = conn.execute(
        """
        WITH busy AS (
            SELECT DISTINCT tenant_id, customer_id FROM stripe_outbox
            WHERE status = 'pending' AND claimed_until > %(now)s
        ), due AS (
            SELECT o.id FROM stripe_outbox o
            WHERE o.status = 'pending' AND o.next_attempt_at <= %(now)s
              AND (o.claimed_until IS NULL OR o.claimed_until <= %(now)s)
              AND NOT EXISTS (SELECT 1 FROM busy b WHERE b.tenant_id = o.tenant_id
                                                     AND b.customer_id = o.customer_id)
            ORDER BY o.id LIMIT %(limit)s
        )
        UPDATE stripe_outbox o SET claimed_until = %(until)s
        FROM due, customers c
        WHERE o.id = due.id AND c.tenant_id = o.tenant_id AND c.id = o.customer_id
        RETURNING o.id, o.tenant_id, o.customer_id, c.stripe_customer_id, o.run_id,
                  o.decision_version, o.target_billed_micros, o.period, o.event_timestamp,
                  o.plan, o.next_step, o.attempts
        """,
        {"now": now, "limit": limit, "until": now + lease},
    ).fetchall()
    items = [
        OutboxItem(
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
        )
        for r in rows
    ]
    items.sort(key=lambda i: i.id)
    return items


def load_sent(conn: psycopg.Connection[Any], run_id: int) -> list[Sent]:
    rows = conn.execute(
        "SELECT kind, identifier, micros, units, stripe_received_at, cancels_identifier "
        "FROM stripe_deliveries WHERE run_id = %s ORDER BY id",
        (run_id,),
    ).fetchall()
    return [Sent(*r) for r in rows]


def lock_carry(conn: psycopg.Connection[Any], tenant: str, customer: str, period: str) -> Carry:
    conn.execute(
        "INSERT INTO stripe_carries (tenant_id, customer_id, period) VALUES (%s, %s, %s) "
        "ON CONFLICT DO NOTHING",
        (tenant, customer, period),
    )
    row = conn.execute(
        "SELECT meter_carry_micros, credit_carry_micros FROM stripe_carries "
        "WHERE tenant_id = %s AND customer_id = %s AND period = %s FOR UPDATE",
        (tenant, customer, period),
    ).fetchone()
    assert row is not None
    return Carry(int(row[0]), int(row[1]))


def save_plan(
    conn: psycopg.Connection[Any], item: OutboxItem, steps: list[Step], carry: Carry
) -> None:
    conn.execute(
        "UPDATE stripe_carries SET meter_carry_micros = %s, credit_carry_micros = %s "
        "WHERE tenant_id = %s AND customer_id = %s AND period = %s",
        (carry.meter_micros, carry.credit_micros, item.tenant_id, item.customer_id, item.period),
    )
    conn.execute(
        "UPDATE stripe_outbox SET plan = %s, next_step = 0 WHERE id = %s",
        (Jsonb([s.as_json() for s in steps]), item.id),
    )


def record_step(
    conn: psycopg.Connection[Any],
    item: OutboxItem,
    index: int,
    step: Step,
    received_at: datetime,
    note: str | None,
    last: bool,
    now: datetime,
) -> None:
    """The step took effect: record the delivery and move the row on, in one transaction."""
    conn.execute(
        """
        INSERT INTO stripe_deliveries (outbox_id, tenant_id, customer_id, run_id, kind,
            identifier, cancels_identifier, micros, units, cents, event_timestamp,
            stripe_received_at, note)
        VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
        ON CONFLICT (kind, identifier) DO NOTHING
        """,
        (
            item.id,
            item.tenant_id,
            item.customer_id,
            item.run_id,
            step.kind,
            step.identifier,
            step.cancels_identifier,
            step.micros,
            step.units,
            step.cents,
            datetime.fromtimestamp(step.timestamp, UTC) if step.timestamp else None,
            received_at,
            note,
        ),
    )
    conn.execute(
        """
        UPDATE stripe_outbox SET next_step = %s,
            status = CASE WHEN %s AND status = 'pending' THEN 'sent' ELSE status END,
            completed_at = CASE WHEN %s THEN %s ELSE completed_at END,
            claimed_until = CASE WHEN %s THEN NULL ELSE claimed_until END
        WHERE id = %s
        """,
        (index + 1, last, last, now, last, item.id),
    )


def finish_empty(conn: psycopg.Connection[Any], item: OutboxItem, now: datetime) -> None:
    conn.execute(
        "UPDATE stripe_outbox SET status = CASE WHEN status = 'pending' THEN 'sent' ELSE status "
        "END, completed_at = %s, claimed_until = NULL WHERE id = %s",
        (now, item.id),
    )


def retry_later(conn: psycopg.Connection[Any], item: OutboxItem, error: str, at: datetime) -> None:
    conn.execute(
        "UPDATE stripe_outbox SET attempts = attempts + 1, next_attempt_at = %s, "
        "claimed_until = NULL, last_error = %s WHERE id = %s",
        (at, error[:2000], item.id),
    )


def defer_behind(conn: psycopg.Connection[Any], failed_id: int, ids: Sequence[int]) -> None:
    """Unclaim ``ids`` (a customer's rows after ``failed_id``) and make them due no earlier
    than that row's next attempt: the customer's order holds, and nothing waits for a
    claim lease to expire."""
    conn.execute(
        """
        UPDATE stripe_outbox SET claimed_until = NULL, next_attempt_at = GREATEST(
            next_attempt_at, (SELECT next_attempt_at FROM stripe_outbox WHERE id = %(failed)s))
        WHERE id = ANY(%(ids)s) AND status = 'pending'
        """,
        {"failed": failed_id, "ids": list(ids)},
    )


def mark_dead(conn: psycopg.Connection[Any], item: OutboxItem, error: str) -> None:
    conn.execute(
        "UPDATE stripe_outbox SET status = 'dead', attempts = attempts + 1, "
        "claimed_until = NULL, last_error = %s WHERE id = %s",
        (error[:2000], item.id),
    )


def period_closed(conn: psycopg.Connection[Any], stripe_customer_id: str, moment: datetime) -> bool:
    row = conn.execute(
        "SELECT 1 FROM stripe_closed_periods WHERE stripe_customer_id = %s "
        "AND period_start <= %s AND %s < period_end LIMIT 1",
        (stripe_customer_id, moment, moment),
    ).fetchone()
    return row is not None


def release_waiting(conn: psycopg.Connection[Any], tenant: str, customer: str) -> int:
    """A customer got its Stripe id: its waiting rows become due now."""
    result = conn.execute(
        "UPDATE stripe_outbox SET status = 'pending', next_attempt_at = now() "
        "WHERE tenant_id = %s AND customer_id = %s AND status = 'waiting_customer'",
        (tenant, customer),
    )
    return result.rowcount


def retry_dead(conn: psycopg.Connection[Any], tenant: str | None, ids: Sequence[int]) -> int:
    """Dead rows go back to pending (after the cause was fixed)."""
    result = conn.execute(
        "UPDATE stripe_outbox SET status = 'pending', next_attempt_at = now(), attempts = 0 "
        "WHERE status = 'dead' AND (%(all)s OR id = ANY(%(ids)s)) "
        "AND (%(tenant)s::text IS NULL OR tenant_id = %(tenant)s)",
        {"all": not ids, "ids": list(ids), "tenant": tenant},
    )
    return result.rowcount


@dataclass(frozen=True, slots=True)
class DeadRow:
    id: int
    tenant_id: str
    customer_id: str
    run_id: int
    decision_version: int
    target_billed_micros: int
    attempts: int
    last_error: str | None


def list_dead(conn: psycopg.Connection[Any], tenant: str | None) -> list[DeadRow]:
    rows = conn.execute(
        "SELECT id, tenant_id, customer_id, run_id, decision_version, target_billed_micros, "
        "attempts, last_error FROM stripe_outbox WHERE status = 'dead' "
        "AND (%(tenant)s::text IS NULL OR tenant_id = %(tenant)s) ORDER BY id",
        {"tenant": tenant},
    ).fetchall()
    return [DeadRow(*r) for r in rows]


def status_counts(conn: psycopg.Connection[Any]) -> dict[str, int]:
    rows = conn.execute("SELECT status, count(*) FROM stripe_outbox GROUP BY status").fetchall()
    return {status: int(count) for status, count in rows}


def load_sent_for_runs(
    conn: psycopg.Connection[Any], run_ids: Sequence[int]
) -> dict[int, list[Sent]]:
    rows = conn.execute(
        "SELECT run_id, kind, identifier, micros, units, stripe_received_at, cancels_identifier "
        "FROM stripe_deliveries WHERE run_id = ANY(%s) ORDER BY id",
        (list(run_ids),),
    ).fetchall()
    sent: dict[int, list[Sent]] = {}
    for run_id, *fields in rows:
        sent.setdefault(run_id, []).append(Sent(*fields))
    return sent
