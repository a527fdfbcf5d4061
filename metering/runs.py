"""Read side of a run: what ``GET /v1/runs/{run}`` shows."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from metering.errors import not_found
from metering.keys import Principal, Scope
from metering.policy import HELD_FOR_REVIEW
from metering.policy.facts import EventFact
from metering.policy.status import live_status, run_status


@dataclass(frozen=True, slots=True)
class DecisionView:
    version: int
    origin: str
    outcome: str
    status: str
    gross_micros: int
    billed_micros: int
    credited_micros: int
    rule_ids: list[str]
    evidence_event_ids: list[str]
    explanation: str
    period: str
    decided_at: datetime


@dataclass(frozen=True, slots=True)
class RunView:
    run_id: int
    run: str
    customer: str
    status: str
    outcome: str | None
    gross_micros: int
    billed_micros: int | None
    credited_micros: int | None
    held_micros: int | None
    tentative_micros: int
    rule_ids: list[str]
    explanation: str | None
    decisions: list[DecisionView]
    event_count: int
    event_counts: dict[str, int]
    first_event_at: datetime
    last_event_at: datetime
    last_received_at: datetime
    terminal_at: datetime | None
    attempts: int
    settled: bool
    reopened: bool
    parked: bool


RUN_ROW = """
SELECT id, customer_id, first_event_at, last_event_at, last_received_at, terminal_at,
       event_count, gross_micros, decision_version, evidence_version, settled_evidence_version,
       parked_at
FROM runs WHERE tenant_id = %s AND subject = %s
"""

RUN_EVENTS = "SELECT event_id, type, time, data FROM events WHERE run_id = %s ORDER BY time, id"

RUN_DECISIONS = """
SELECT version, origin, outcome, status, gross_micros, billed_micros, credited_micros,
       rule_ids, evidence_event_ids, explanation, period, decided_at
FROM decisions WHERE run_id = %s ORDER BY version
"""


def visible_to(principal: Principal, customer_id: str) -> bool:
    """Tenant keys see every run of their tenant; a customer key only its own customer's."""
    if principal.scope is Scope.CUSTOMER:
        return principal.customer_id == customer_id
    return True


def find_run_id(conn: psycopg.Connection[Any], principal: Principal, subject: str) -> int:
    """The run's id when the principal may see it; 404 otherwise (ids cannot be probed)."""
    row = conn.execute(
        "SELECT id, customer_id FROM runs WHERE tenant_id = %s AND subject = %s",
        (principal.tenant_id, subject),
    ).fetchone()
    if row is None or not visible_to(principal, row[1]):
        raise not_found(f"no run {subject}", code="run_not_found")
    return int(row[0])


def get_run_view(conn: psycopg.Connection[Any], principal: Principal, subject: str) -> RunView:
    """The run as its reader may see it; 404 for runs of other tenants or customers."""
    row = conn.execute(RUN_ROW, (principal.tenant_id, subject)).fetchone()
    if row is None or not visible_to(principal, row[1]):
        raise not_found(f"no run {subject}", code="run_not_found")
    (
        run_id,
        customer,
        first_at,
        last_at,
        received_at,
        terminal_at,
        count,
        gross,
        decision_version,
        evidence_version,
        settled_version,
        parked_at,
    ) = row
    facts = [EventFact(*e) for e in conn.execute(RUN_EVENTS, (run_id,)).fetchall()]
    decisions = [DecisionView(*d) for d in conn.execute(RUN_DECISIONS, (run_id,)).fetchall()]
    in_force = decisions[-1] if decisions else None
    reopened = decision_version > 0 and evidence_version > settled_version
    billed, credited, held = ledger_position(in_force, int(gross))
    status = run_status(
        parked=parked_at is not None,
        reopened=reopened,
        decided=in_force.status if in_force else None,
        live=lambda: live_status(facts, terminal=terminal_at is not None),
    )
    return RunView(
        run_id=run_id,
        run=subject,
        customer=customer,
        status=status,
        outcome=in_force.outcome if in_force else None,
        gross_micros=int(gross),
        billed_micros=billed,
        credited_micros=credited,
        held_micros=held,
        tentative_micros=tentative_micros(in_force, int(gross)),
        rule_ids=in_force.rule_ids if in_force else [],
        explanation=in_force.explanation if in_force else None,
        decisions=decisions,
        event_count=count,
        event_counts=dict(Counter(f.type for f in facts)),
        first_event_at=first_at,
        last_event_at=last_at,
        last_received_at=received_at,
        terminal_at=terminal_at,
        attempts=max((int(f.data.get("attempt", 1)) for f in facts), default=1),
        # A re-opened run is not settled: its late usage waits for the next decision.
        settled=decision_version > 0 and not reopened,
        reopened=reopened,
        parked=parked_at is not None,
    )


def ledger_position(
    decision: DecisionView | None, gross_micros: int
) -> tuple[int | None, int | None, int | None]:
    """(billed, credited, held) as the ledger has them, summing to the run's gross.

    A run held for review (R7/R8) posts nothing until support resolves it, so its whole
    gross is held, not billed; the policy's provisional split stays visible in the decision
    history. Usage that arrived after the decision in force is held too (the ledger has its
    holds and nothing posted against them) until the run settles again, so
    ``gross = billed + credited + held`` at every moment. ``None`` for all three until the
    run is first settled (DESIGN §6).
    """
    if decision is None:
        return None, None, None
    if decision.outcome == HELD_FOR_REVIEW:
        billed, credited = 0, 0
    else:
        billed, credited = decision.billed_micros, decision.credited_micros
    return billed, credited, gross_micros - billed - credited


def tentative_micros(decision: DecisionView | None, gross_micros: int) -> int:
    """Usage no decision has seen yet: all of it before the first settlement, afterwards
    what late events added since the decision in force."""
    if decision is None:
        return gross_micros
    return gross_micros - decision.gross_micros
