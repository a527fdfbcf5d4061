"""Read side for support: a run's full timeline, run search, disputes."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from metering.disputes import audit
from metering.keys import Principal
from metering.runs import RunView, find_run_id, get_run_view, live_statuses

SERVER_SIDE = "server"
CLIENT_SIDE = "client"


def evidence_side(event_type: str, data: dict[str, Any]) -> str | None:
    """Whose word an event is: our infrastructure's (server) or the user's app (client)."""
    if event_type in ("connection.lost", "connection.restored"):
        return str(data.get("side"))
    if event_type == "run.failed":
        return CLIENT_SIDE if data.get("cause") == "client" else SERVER_SIDE
    if event_type == "run.cancelled":
        return CLIENT_SIDE if data.get("by") == "user" else SERVER_SIDE
    return None


@dataclass(frozen=True, slots=True)
class TimelineEvent:
    time: datetime
    received_at: datetime
    source: str
    id: str
    type: str
    attempt: int
    side: str | None
    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class LedgerLine:
    kind: str
    amount_micros: int
    corrects: str | None
    decision_version: int | None
    created_at: datetime


@dataclass(frozen=True, slots=True)
class StripeState:
    decision_version: int
    status: str
    target_billed_micros: int
    attempts: int
    last_error: str | None
    deliveries: list[dict[str, Any]]

    @property
    def rejected_by_stripe(self) -> bool:
        """Stripe answered 200, then reported the meter event invalid (an error report):
        it never reaches the invoice, whatever the send looked like."""
        return any(d.get("kind") == "meter_rejected" for d in self.deliveries)

    @property
    def label(self) -> str:
        """The row's state in words: a dead-lettered rejection says who rejected it."""
        if self.status == "dead" and self.rejected_by_stripe:
            return "rejected by Stripe"
        return self.status.replace("_", " ")


@dataclass(frozen=True, slots=True)
class Dispute:
    id: int
    run: str
    customer_id: str
    status: str
    claim: str
    opened_by: str
    opened_at: datetime
    resolved_by: str | None
    resolved_at: datetime | None
    resolution_reason: str | None
    credit_micros: int


@dataclass(frozen=True, slots=True)
class Timeline:
    run: RunView
    events: list[TimelineEvent]
    ledger: list[LedgerLine]
    stripe: list[StripeState]
    disputes: list[Dispute]
    audit: list[audit.AuditEntry]


DISPUTE_COLUMNS = """
d.id, r.subject, d.customer_id, d.status, d.claim, d.opened_by, d.opened_at, d.resolved_by,
d.resolved_at, d.resolution_reason, d.credit_micros
"""


def timeline(conn: psycopg.Connection[Any], principal: Principal, subject: str) -> Timeline:
    view = get_run_view(conn, principal, subject)
    run_id = find_run_id(conn, principal, subject)
    events = [
        TimelineEvent(
            t, rcv, src, eid, typ, int(data.get("attempt", 1)), evidence_side(typ, data), data
        )
        for t, rcv, src, eid, typ, data in conn.execute(
            "SELECT time, received_at, source, event_id, type, data FROM events "
            "WHERE run_id = %s ORDER BY time, id",
            (run_id,),
        ).fetchall()
    ]
    ledger = [
        LedgerLine(*row)
        for row in conn.execute(
            "SELECT kind, amount_micros, corrects, decision_version, created_at "
            "FROM ledger_entries WHERE run_id = %s ORDER BY id",
            (run_id,),
        ).fetchall()
    ]
    return Timeline(
        run=view,
        events=events,
        ledger=ledger,
        stripe=_stripe(conn, run_id),
        disputes=disputes(conn, principal, run_id=run_id),
        audit=audit.entries(conn, principal.tenant_id, target_id=subject, limit=50),
    )


def _stripe(conn: psycopg.Connection[Any], run_id: int) -> list[StripeState]:
    rows = conn.execute(
        """
        SELECT o.decision_version, o.status, o.target_billed_micros, o.attempts, o.last_error,
               coalesce(json_agg(json_build_object('kind', d.kind, 'identifier', d.identifier,
                   'micros', d.micros, 'units', d.units, 'cents', d.cents,
                   'received_at', d.stripe_received_at, 'note', d.note) ORDER BY d.id)
                   FILTER (WHERE d.id IS NOT NULL), '[]')
        FROM stripe_outbox o
        LEFT JOIN stripe_deliveries d ON d.tenant_id = o.tenant_id AND d.outbox_id = o.id
        WHERE o.run_id = %s GROUP BY o.tenant_id, o.id ORDER BY o.id
        """,
        (run_id,),
    ).fetchall()
    return [StripeState(*row) for row in rows]


def disputes(
    conn: psycopg.Connection[Any],
    principal: Principal,
    *,
    run_id: int | None = None,
    status: str | None = None,
    limit: int = 200,
) -> list[Dispute]:
    rows = conn.execute(
        f"SELECT {DISPUTE_COLUMNS} FROM disputes d JOIN runs r ON r.id = d.run_id "
        "WHERE d.tenant_id = %s AND (%s::bigint IS NULL OR d.run_id = %s) "
        "AND (%s::text IS NULL OR d.status = %s) ORDER BY d.id DESC LIMIT %s",
        (principal.tenant_id, run_id, run_id, status, status, limit),
    ).fetchall()
    return [Dispute(*row) for row in rows]


@dataclass(frozen=True, slots=True)
class RunSummary:
    run: str
    customer_id: str
    status: str | None
    outcome: str | None
    gross_micros: int
    billed_micros: int
    credited_micros: int
    last_event_at: datetime
    ended_at: datetime | None
    open_dispute: bool
    parked: bool = False


def search_runs(
    conn: psycopg.Connection[Any],
    principal: Principal,
    *,
    customer: str | None = None,
    outcome: str | None = None,
    ended_from: datetime | None = None,
    ended_to: datetime | None = None,
    queue: bool = False,
    text: str | None = None,
    limit: int = 100,
) -> list[RunSummary]:
    """Runs of the tenant, newest first; ``queue`` = held for review or with an open dispute."""
    rows = conn.execute(
        """
        SELECT r.id, r.subject, r.customer_id, r.status, r.outcome, r.gross_micros,
               r.billed_micros,
               r.credited_micros, r.last_event_at, r.ended_at,
               EXISTS (SELECT 1 FROM disputes d WHERE d.run_id = r.id AND d.status = 'open'),
               r.parked_at IS NOT NULL
        FROM runs r
        WHERE r.tenant_id = %(tenant)s
          AND (%(customer)s::text IS NULL OR r.customer_id = %(customer)s)
          AND (%(outcome)s::text IS NULL OR r.outcome = %(outcome)s)
          AND (%(from)s::timestamptz IS NULL OR r.ended_at >= %(from)s)
          AND (%(to)s::timestamptz IS NULL OR r.ended_at < %(to)s)
          AND (%(text)s::text IS NULL OR r.subject ILIKE '%%' || %(text)s || '%%'
               OR r.customer_id ILIKE '%%' || %(text)s || '%%')
          AND (NOT %(queue)s OR r.outcome = 'held_for_review' OR r.parked_at IS NOT NULL
               OR EXISTS (SELECT 1 FROM disputes d WHERE d.run_id = r.id AND d.status = 'open'))
        ORDER BY r.last_event_at DESC, r.id DESC
        LIMIT %(limit)s
        """,
        {
            "tenant": principal.tenant_id,
            "customer": customer,
            "outcome": outcome,
            "from": ended_from,
            "to": ended_to,
            "queue": queue,
            "text": text or None,
            "limit": limit,
        },
    ).fetchall()
    # The stored status is a decision's; a page shows what GET /v1/runs says, live.
    words = live_statuses(conn, [row[0] for row in rows])
    return [RunSummary(row[1], row[2], words[row[0]], *row[4:]) for row in rows]
