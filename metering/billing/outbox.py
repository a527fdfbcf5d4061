"""The Stripe outbox's storage: written by settlement, claimed and advanced by the pusher."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import psycopg
from psycopg.types.json import Jsonb

from metering.billing import carries
from metering.billing.plan import BillingPeriods, Sent, Step, carry_effect


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


def enqueue(conn: psycopg.Connection[Any], rows: Sequence[OutboxRow], *, unit_micros: int) -> None:
    """Written in the settlement transaction. Older unsent versions of the same run are
    superseded: the newest plan is computed from what Stripe actually received, and the
    carry the superseded rows' unsent steps took is given back (``unit_micros``: the meter
    unit they were planned in), else Σ units × unit + carry = Σ micros drifts by up to a
    unit each time. A row a live pusher still holds (claimed, under the customer's lease
    in force: ``claims``) keeps its carry: its steps in flight are sent and recorded all
    the same. Who may send is the lease's to decide, not the row's status: the pusher
    holding the customer goes on with the superseded row, and the new one is planned by
    whoever holds the customer next, against what the old one recorded.

    A run's first decision cannot have older rows, so only re-decided runs are looked up
    (most of a sweep is first decisions; the lookup was ~11 µs of PostgreSQL per run).
    """
    if not rows:
        return
    redecided = [r.run_id for r in rows if r.decision_version > 1]
    if redecided:
        superseded = conn.execute(
            """
            WITH old AS (
                SELECT o.id, COALESCE(o.claimed_until > now(), false) AND EXISTS (
                    SELECT 1 FROM stripe_customer_leases l
                    WHERE l.tenant_id = o.tenant_id AND l.customer_id = o.customer_id
                      AND l.held_until > now()) AS sending
                FROM stripe_outbox o
                WHERE o.run_id = ANY(%(runs)s) AND o.status IN ('pending', 'waiting_customer')
                ORDER BY o.id FOR UPDATE OF o
            )
            UPDATE stripe_outbox o SET status = 'superseded', claimed_until = NULL
            FROM old WHERE o.id = old.id
            RETURNING o.id, NOT old.sending
            """,
            {"runs": redecided},
        ).fetchall()
        _give_back_carries(conn, [row_id for row_id, idle in superseded if idle], unit_micros)
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
        ON CONFLICT (run_id, decision_version, tenant_id) DO NOTHING
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
    generation: int = 0
    first_attempt_at: datetime | None = None


def load_sent(conn: psycopg.Connection[Any], run_id: int) -> list[Sent]:
    rows = conn.execute(
        "SELECT kind, identifier, micros, units, stripe_received_at, cancels_identifier, "
        "event_timestamp FROM stripe_deliveries WHERE run_id = %s ORDER BY id",
        (run_id,),
    ).fetchall()
    return [Sent(*r) for r in rows]


def save_plans(
    conn: psycopg.Connection[Any], plans: Sequence[tuple[OutboxItem, list[Step]]]
) -> None:
    """Persist the rows' plans before any call (with the carries after them, in the same
    transaction: ``carries.save``)."""
    conn.execute(
        """
        UPDATE stripe_outbox o SET plan = u.plan, next_step = 0
        FROM unnest(%s::bigint[], %s::jsonb[]) AS u(id, plan) WHERE o.id = u.id
        """,
        (
            [item.id for item, _ in plans],
            [Jsonb([s.as_json() for s in steps]) for _, steps in plans],
        ),
    )


@dataclass(frozen=True, slots=True)
class Delivery:
    """A step that took effect at Stripe, to be recorded."""

    item: OutboxItem
    index: int
    step: Step
    received_at: datetime
    note: str | None
    last: bool  # the row's last step: the row is sent
    invoice_id: str | None = None  # credit notes: the invoice, its currency, the amount
    currency: str | None = None
    amount_minor: int | None = None


def record_deliveries(
    conn: psycopg.Connection[Any], done: Sequence[Delivery], now: datetime
) -> None:
    """Record the deliveries and move their rows on, in one transaction and two statements
    (in delivery order, so a run's deliveries keep their ids in the order they happened)."""
    if not done:
        return
    _insert_deliveries(conn, done)
    progress: dict[int, Delivery] = {}
    for delivery in done:  # a row's steps are done in order: its latest one counts
        progress[delivery.item.id] = delivery
    conn.execute(
        """
        UPDATE stripe_outbox o SET next_step = u.next,
            status = CASE WHEN u.last AND o.status = 'pending' THEN 'sent' ELSE o.status END,
            completed_at = CASE WHEN u.last THEN %s ELSE o.completed_at END,
            claimed_until = CASE WHEN u.last THEN NULL ELSE o.claimed_until END
        FROM unnest(%s::bigint[], %s::int[], %s::bool[], %s::int[]) AS u(id, next, last, gen)
        WHERE o.id = u.id AND o.generation = u.gen  -- a row re-planned meanwhile starts over
        """,
        (
            now,
            list(progress),
            [d.index + 1 for d in progress.values()],
            [d.last for d in progress.values()],
            [d.item.generation for d in progress.values()],
        ),
    )


def _insert_deliveries(conn: psycopg.Connection[Any], done: Sequence[Delivery]) -> None:
    columns: list[list[Any]] = [[] for _ in range(16)]
    for d in done:
        stamp = datetime.fromtimestamp(d.step.timestamp, UTC) if d.step.timestamp else None
        item, step = d.item, d.step
        row: tuple[Any, ...] = (item.id, item.tenant_id, item.customer_id, item.run_id)
        row += (step.kind, step.identifier, step.cancels_identifier, step.micros, step.units)
        row += (step.cents, stamp, d.received_at, d.note, d.invoice_id, d.currency)
        row += (d.amount_minor,)
        for column, value in zip(columns, row, strict=True):
            column.append(value)
    # Recorded once per (tenant, kind, identifier), forever: the key goes to the
    # unpartitioned stripe_delivery_keys (migration 0024), and only a delivery whose key is
    # new is written. Keys in one order, so concurrent pushers cannot deadlock on them.
    conn.execute(
        """
        WITH u AS (
            SELECT DISTINCT ON (t, k, i) *
            FROM unnest(%s::bigint[], %s::text[], %s::text[], %s::bigint[], %s::text[],
                        %s::text[], %s::text[], %s::bigint[], %s::bigint[], %s::bigint[],
                        %s::timestamptz[], %s::timestamptz[], %s::text[], %s::text[], %s::text[],
                        %s::bigint[])
                 WITH ORDINALITY AS u(o, t, c, r, k, i, ci, m, un, ce, ts, ra, n, inv, cur, am,
                                      ord)
            ORDER BY t, k, i, ord
        ),
        fresh AS (
            INSERT INTO stripe_delivery_keys (tenant_id, kind, identifier)
            SELECT t, k, i FROM u ORDER BY t, k, i
            ON CONFLICT DO NOTHING
            RETURNING tenant_id, kind, identifier
        )
        INSERT INTO stripe_deliveries (outbox_id, tenant_id, customer_id, run_id, kind,
            identifier, cancels_identifier, micros, units, cents, event_timestamp,
            stripe_received_at, note, invoice_id, currency, amount_minor)
        SELECT o, t, c, r, k, i, ci, m, un, ce, ts, ra, n, inv, cur, am
        FROM u JOIN fresh f ON f.tenant_id = u.t AND f.kind = u.k AND f.identifier = u.i
        ORDER BY ord
        """,
        columns,
    )


def credited_on_invoice(
    conn: psycopg.Connection[Any], tenant: str, invoice_id: str
) -> tuple[int, int]:
    """``(units, minor)`` our recorded credit notes took off ``invoice_id`` (notes that came
    to 0 minor units included: their units are credited by a later note)."""
    row = conn.execute(
        "SELECT COALESCE(sum(units), 0), COALESCE(sum(amount_minor), 0) FROM stripe_deliveries "
        "WHERE tenant_id = %s AND kind = 'credit_note' AND invoice_id = %s",
        (tenant, invoice_id),
    ).fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


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


def release_waiting(conn: psycopg.Connection[Any], tenant: str, customer: str) -> int:
    """A customer got its Stripe id: its waiting rows become due now."""
    result = conn.execute(
        "UPDATE stripe_outbox SET status = 'pending', next_attempt_at = now() "
        "WHERE tenant_id = %s AND customer_id = %s AND status = 'waiting_customer'",
        (tenant, customer),
    )
    return result.rowcount


def retry_dead(
    conn: psycopg.Connection[Any], tenant: str | None, ids: Sequence[int], unit_micros: int
) -> int:
    """Dead rows go back to pending (after the cause was fixed), to be planned again from
    what Stripe actually has: a dead row's remaining steps never took effect, so replaying
    its old plan from ``next_step`` would resend nothing (or the wrong thing)."""
    rows = conn.execute(
        "SELECT id FROM stripe_outbox WHERE status = 'dead' AND (%(all)s OR id = ANY(%(ids)s)) "
        "AND (%(tenant)s::text IS NULL OR tenant_id = %(tenant)s) ORDER BY id FOR UPDATE",
        {"all": not ids, "ids": list(ids), "tenant": tenant},
    ).fetchall()
    return replan(conn, [r[0] for r in rows], unit_micros)


def replan(conn: psycopg.Connection[Any], ids: Sequence[int], unit_micros: int) -> int:
    """Rows ``ids`` become pending and unplanned, under a new generation of keys and
    identifiers; the carries their unsent steps had taken are given back."""
    if not ids:
        return 0
    _give_back_carries(conn, ids, unit_micros)
    result = conn.execute(
        "UPDATE stripe_outbox SET status = 'pending', next_attempt_at = now(), attempts = 0, "
        "plan = NULL, next_step = 0, generation = generation + 1, first_attempt_at = NULL, "
        "claimed_until = NULL, completed_at = NULL WHERE id = ANY(%s)",
        (list(ids),),
    )
    return result.rowcount


def _give_back_carries(conn: psycopg.Connection[Any], ids: Sequence[int], unit_micros: int) -> None:
    """Undo what rows ``ids``' unsent steps (``plan[next_step:]``) moved the carries by:
    those steps will never be sent under this plan."""
    if not ids:
        return
    rows = conn.execute(
        "SELECT tenant_id, customer_id, plan, next_step FROM stripe_outbox "
        "WHERE id = ANY(%s) ORDER BY id FOR UPDATE",
        (list(ids),),
    ).fetchall()
    for tenant, customer, steps, next_step in rows:
        unsent = [Step.from_json(s) for s in (steps or [])[next_step:]]
        effect = carry_effect(unsent, unit_micros)
        carries.add(conn, tenant, customer, {p: -m for p, m in effect.items()})


def billing_periods(
    conn: psycopg.Connection[Any],
    stripe_customer_ids: Sequence[str],
    grace: timedelta,
    margin: timedelta,
) -> dict[str, BillingPeriods]:
    """What the invoice webhooks told us, per Stripe customer, for the planner."""
    rows = conn.execute(
        "SELECT stripe_customer_id, status, period_start, period_end, finalizes_at "
        "FROM stripe_invoices WHERE stripe_customer_id = ANY(%(c)s) "
        "UNION ALL SELECT stripe_customer_id, 'open', period_start, period_end, NULL "
        "FROM stripe_closed_periods WHERE stripe_customer_id = ANY(%(c)s)",
        {"c": sorted(set(stripe_customer_ids))},
    ).fetchall()
    finalized: dict[str, list[tuple[datetime, datetime]]] = {}
    drafts: dict[str, list[tuple[datetime, datetime, datetime]]] = {}
    for customer, status, start, end, finalizes_at in rows:
        if status == "draft" and finalizes_at is not None:
            drafts.setdefault(customer, []).append((start, end, finalizes_at))
        elif status != "draft":
            finalized.setdefault(customer, []).append((start, end))
    return {
        customer: BillingPeriods(
            tuple(finalized.get(customer, [])), tuple(drafts.get(customer, [])), grace, margin
        )
        for customer in set(stripe_customer_ids)
    }


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
        "SELECT run_id, kind, identifier, micros, units, stripe_received_at, cancels_identifier, "
        "event_timestamp FROM stripe_deliveries WHERE run_id = ANY(%s) ORDER BY id",
        (list(run_ids),),
    ).fetchall()
    sent: dict[int, list[Sent]] = {}
    for run_id, *fields in rows:
        sent.setdefault(run_id, []).append(Sent(*fields))
    return sent
