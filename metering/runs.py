"""Read side of a run: what ``GET /v1/runs/{run}`` shows."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial
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
    policy_version: int = 0  # the tenant's policy version that made it (0: the settings)


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
    policy_version: int | None = None  # of the decision in force; None until decided
    # "cloudevents" or "otlp": how the run's usage came (metering/ingest/protocol.py); None
    # before any usage. Usage through the other protocol is refused.
    usage_protocol: str | None = None


RUN_ROW = """
SELECT id, customer_id, first_event_at, last_event_at, last_received_at, terminal_at,
       event_count, gross_micros, decision_version, evidence_version, settled_evidence_version,
       parked_at, usage_protocol
FROM runs WHERE tenant_id = %s AND subject = %s
"""

RUN_EVENTS = "SELECT event_id, type, time, data FROM events WHERE run_id = %s ORDER BY time, id"

RUN_DECISIONS = """
SELECT version, origin, outcome, status, gross_micros, billed_micros, credited_micros,
       rule_ids, evidence_event_ids, explanation, period, decided_at, policy_version
FROM decisions WHERE run_id = %s ORDER BY version
"""


def visible_to(principal: Principal, customer_id: str) -> bool:
    """Tenant keys see every run of their tenant; a customer key only its own customer's."""
    if principal.scope is Scope.CUSTOMER:
        return principal.customer_id == customer_id
    return True


def find_run_id(conn: psycopg.Connection[Any], principal: Principal, subject: str) -> int:
    """The run's id when the principal may see it; 404 otherwise (ids cannot be probed)."""
    return find_run(conn, principal, subject)[0]


def find_run(conn: psycopg.Connection[Any], principal: Principal, subject: str) -> tuple[int, str]:
    """The run's id and customer when the principal may see it; 404 otherwise."""
    row = conn.execute(
        "SELECT id, customer_id FROM runs WHERE tenant_id = %s AND subject = %s",
        (principal.tenant_id, subject),
    ).fetchone()
    if row is None or not visible_to(principal, row[1]):
        raise not_found(f"no run {subject}", code="run_not_found")
    return int(row[0]), str(row[1])


def get_run_view(conn: psycopg.Connection[Any], principal: Principal, subject: str) -> RunView:
    """The run as its reader may see it; 404 for runs of other tenants or customers."""
    row = conn.execute(RUN_ROW, (principal.tenant_id, subject)).fetchone()
    if row is None or not visible_to(principal, row[1]):
        raise not_found(f"no run {subject}", code="run_not_found")
    run_id = row[0]
    facts = [EventFact(*e) for e in conn.execute(RUN_EVENTS, (run_id,)).fetchall()]
    decisions = [DecisionView(*d) for d in conn.execute(RUN_DECISIONS, (run_id,)).fetchall()]
    return _view(subject, row, facts, decisions)


RUNS_BY_ID = """
SELECT id, customer_id, first_event_at, last_event_at, last_received_at, terminal_at,
       event_count, gross_micros, decision_version, evidence_version, settled_evidence_version,
       parked_at, usage_protocol, subject
FROM runs WHERE id = ANY(%s)
"""
RUNS_EVENTS = (
    "SELECT run_id, event_id, type, time, data FROM events WHERE run_id = ANY(%s) "
    "ORDER BY run_id, time, id"
)
RUNS_DECISIONS = """
SELECT run_id, version, origin, outcome, status, gross_micros, billed_micros, credited_micros,
       rule_ids, evidence_event_ids, explanation, period, decided_at
FROM decisions WHERE run_id = ANY(%s) ORDER BY run_id, version
"""


def run_views(conn: psycopg.Connection[Any], run_ids: Sequence[int]) -> dict[int, RunView]:
    """Many runs at once, by id, in three queries (the webhook fan-out embeds a run in each
    of hundreds of messages at a time; a few queries per run made it the slow half of
    delivery). For the service's own readers: no principal, so no visibility check. Ids of
    no run are absent from the answer."""
    if not run_ids:
        return {}
    ids = list(set(run_ids))
    rows = conn.execute(RUNS_BY_ID, (ids,)).fetchall()
    facts: dict[int, list[EventFact]] = {int(r[0]): [] for r in rows}
    decisions: dict[int, list[DecisionView]] = {int(r[0]): [] for r in rows}
    for run_id, *fact in conn.execute(RUNS_EVENTS, (ids,)).fetchall():
        facts[run_id].append(EventFact(*fact))
    for run_id, *decision in conn.execute(RUNS_DECISIONS, (ids,)).fetchall():
        decisions[run_id].append(DecisionView(*decision))
    return {int(r[0]): _view(r[13], r[:13], facts[int(r[0])], decisions[int(r[0])]) for r in rows}


def _view(
    subject: str, row: Sequence[Any], facts: list[EventFact], decisions: list[DecisionView]
) -> RunView:
    """A run's view from its row (the columns of ``RUN_ROW``), events and decisions."""
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
        usage_protocol,
    ) = row
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
        policy_version=in_force.policy_version if in_force else None,
        usage_protocol=usage_protocol,
    )


def live_statuses(conn: psycopg.Connection[Any], run_ids: Sequence[int]) -> dict[int, str]:
    """``run_status`` for many runs at once (a page of runs), from their rows and events."""
    if not run_ids:
        return {}
    rows = conn.execute(
        """
        SELECT r.id, r.parked_at IS NOT NULL, r.terminal_at IS NOT NULL,
               r.decision_version > 0 AND r.evidence_version > r.settled_evidence_version,
               (SELECT d.status FROM decisions d WHERE d.run_id = r.id
                ORDER BY d.version DESC LIMIT 1)
        FROM runs r WHERE r.id = ANY(%s)
        """,
        (list(run_ids),),
    ).fetchall()
    undecided = [r[0] for r in rows if r[4] is None and not r[1]]
    facts: dict[int, list[EventFact]] = {run_id: [] for run_id in undecided}
    if undecided:
        for run_id, *fact in conn.execute(
            "SELECT run_id, event_id, type, time, data FROM events WHERE run_id = ANY(%s) "
            "ORDER BY time, id",
            (undecided,),
        ).fetchall():
            facts[run_id].append(EventFact(*fact))
    return {
        run_id: run_status(
            parked=parked,
            reopened=reopened,
            decided=decided,
            live=partial(live_status, facts.get(run_id, []), terminal=terminal),
        )
        for run_id, parked, terminal, reopened, decided in rows
    }


def run_document(view: RunView) -> dict[str, Any]:
    """The run as ``GET /v1/runs/{run}`` shows it, defined here once: the API's reply and
    the ``run`` of every webhook payload are this document (times as ``datetime``, which
    both encode the same way)."""
    return {
        "run": view.run,
        "customer": view.customer,
        "status": view.status,
        "outcome": view.outcome,
        "gross_micros": view.gross_micros,
        "billed_micros": view.billed_micros,
        "credited_micros": view.credited_micros,
        "held_micros": view.held_micros,
        "tentative_micros": view.tentative_micros,
        "rule_ids": list(view.rule_ids),
        "explanation": view.explanation,
        "policy_version": view.policy_version,
        "decisions": [_decision_document(d) for d in view.decisions],
        "event_count": view.event_count,
        "event_counts": dict(view.event_counts),
        "attempts": view.attempts,
        "first_event_at": view.first_event_at,
        "last_event_at": view.last_event_at,
        "last_received_at": view.last_received_at,
        "terminal_at": view.terminal_at,
        "settled": view.settled,
        "reopened": view.reopened,
        "usage_protocol": view.usage_protocol,
    }


def _decision_document(d: DecisionView) -> dict[str, Any]:
    return {
        "version": d.version,
        "origin": d.origin,
        "outcome": d.outcome,
        "status": d.status,
        "gross_micros": d.gross_micros,
        "billed_micros": d.billed_micros,
        "credited_micros": d.credited_micros,
        "rule_ids": list(d.rule_ids),
        "evidence_event_ids": list(d.evidence_event_ids),
        "explanation": d.explanation,
        "period": d.period,
        "decided_at": d.decided_at,
        "policy_version": d.policy_version,
    }


def ledger_position(
    decision: DecisionView | None, gross_micros: int
) -> tuple[int | None, int | None, int | None]:
    """(billed, credited, held) as the ledger has them, summing to the run's gross.

    A run held for review (R7/R8) posts nothing until support resolves it, so its whole
    gross is held, not billed; the policy's provisional split stays visible in the decision
    history. Usage that arrived after the decision in force is held too (the ledger has its
    holds and nothing posted against them) until the run settles again, so
    ``gross = billed + credited + held`` at every moment. ``None`` for all three until the
    run is first settled (docs/policy.md).
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
