"""Read side of a run: what ``GET /v1/runs/{run}`` shows."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg

from metering.errors import not_found
from metering.keys import Principal, Scope
from metering.status import EventFact, live_status


@dataclass(frozen=True, slots=True)
class RunView:
    run: str
    customer: str
    status: str
    outcome: str | None
    gross_micros: int
    billed_micros: int | None
    credited_micros: int | None
    rule_ids: list[str]
    explanation: str | None
    decisions: list[dict[str, Any]]
    event_count: int
    event_counts: dict[str, int]
    first_event_at: datetime
    last_event_at: datetime
    last_received_at: datetime
    terminal_at: datetime | None
    attempts: int = 1
    extra: dict[str, Any] = field(default_factory=dict)


RUN_ROW = """
SELECT id, customer_id, first_event_at, last_event_at, last_received_at, terminal_at,
       event_count
FROM runs WHERE tenant_id = %s AND subject = %s
"""

RUN_EVENTS = "SELECT event_id, type, time, data FROM events WHERE run_id = %s ORDER BY time, id"

RUN_GROSS = (
    "SELECT COALESCE(sum(amount_micros), 0) FROM ledger_entries WHERE run_id = %s AND kind = 'hold'"
)


def visible_to(principal: Principal, customer_id: str) -> bool:
    """Tenant keys see every run of their tenant; a customer key only its own customer's."""
    if principal.scope is Scope.CUSTOMER:
        return principal.customer_id == customer_id
    return True


def get_run_view(conn: psycopg.Connection[Any], principal: Principal, subject: str) -> RunView:
    """The run as its reader may see it; 404 for runs of other tenants or customers."""
    with conn.cursor() as cur:
        cur.execute(RUN_ROW, (principal.tenant_id, subject))
        row = cur.fetchone()
        if row is None or not visible_to(principal, row[1]):
            raise not_found(f"no run {subject}", code="run_not_found")
        run_id, customer, first_at, last_at, received_at, terminal_at, count = row
        cur.execute(RUN_EVENTS, (run_id,))
        facts = [EventFact(e, t, at, d) for e, t, at, d in cur.fetchall()]
        cur.execute(RUN_GROSS, (run_id,))
        (gross,) = cur.fetchone() or (0,)
    attempts = max((int(f.data.get("attempt", 1)) for f in facts), default=1)
    return RunView(
        run=subject,
        customer=customer,
        status=live_status(facts, terminal=terminal_at is not None),
        outcome=None,
        gross_micros=int(gross),
        billed_micros=None,
        credited_micros=None,
        rule_ids=[],
        explanation=None,
        decisions=[],
        event_count=count,
        event_counts=dict(Counter(f.type for f in facts)),
        first_event_at=first_at,
        last_event_at=last_at,
        last_received_at=received_at,
        terminal_at=terminal_at,
        attempts=attempts,
    )
