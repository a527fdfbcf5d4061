"""What-if: replay a period's settled runs through ``decide`` under a candidate policy.

Read-only (the transaction is set READ ONLY before anything is read): it loads each run's
facts the way settlement does, decides it twice — under the policy version that made its
decision in force, and under the candidate — and applies support's credits and releases to
both, as settlement would. The first replay must reproduce the stored decision exactly; the
report counts the runs it did, so a replay that drifted from settlement shows itself.

The R8 cap reads the customer's period as it stood when the run was decided (recorded on the
decision). Under the candidate, the automatic credits and refunds of the customer's runs
that ended earlier are adjusted by what the candidate changes for them. Decisions made
before the period inputs were recorded replay with the period built up in end order.

Runs are streamed through a server-side cursor in batches, in (customer, end, id) order, so
memory holds one batch and the per-customer sums, not the period.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import psycopg

from metering.policies.versions import list_versions, parse_over
from metering.policy import HELD_FOR_REVIEW, REFUNDED, CustomerPeriod, Decision, RunFacts, decide
from metering.policy.document import PolicyDocument
from metering.policy.ending import ending_of_events
from metering.policy.facts import PolicyConfig
from metering.policy.support import SupportGrant, apply_support, covered_credit_micros
from metering.prices import PROVIDER_COSTS, load_catalog
from metering.pricing import PriceCatalog, TokenCounts, UnknownModelError
from metering.settlement.repo import load_evidence
from metering.statements.query import parse_period

BATCH = 500
EXAMPLES = 5

RUNS = """
SELECT r.id, r.subject, r.customer_id, r.ended_at, r.terminal_at IS NULL, r.support_released,
       r.auto_credited_micros, d.outcome, d.billed_micros, d.credited_micros,
       d.credited_line_ids, d.rule_ids, d.evidence_event_ids, d.explanation, d.policy_version,
       d.period_gross_micros, d.period_auto_credited_micros, d.period_auto_refunded_runs,
       r.gross_micros
FROM runs r JOIN decisions d ON d.run_id = r.id AND d.version = r.decision_version
WHERE r.tenant_id = %(tenant)s AND r.period = %(period)s AND r.decision_version > 0
ORDER BY r.customer_id, r.ended_at, r.id
"""


@dataclass
class Position:
    """What a period's runs come to: billed, credited, and held for review (unposted); and
    what their usage cost the platform at the provider (the cost catalog), all of it and the
    part in the lines credited — what protection costs. Margin after protection is billed
    minus all of it."""

    billed_micros: int = 0
    credited_micros: int = 0
    held_micros: int = 0
    provider_cost_micros: int = 0
    credited_provider_cost_micros: int = 0

    @property
    def margin_after_micros(self) -> int:
        return self.billed_micros - self.provider_cost_micros

    def add(
        self, outcome: str, gross: int, billed: int, credited: int, cost: int, credited_cost: int
    ) -> None:
        self.provider_cost_micros += cost
        if outcome == HELD_FOR_REVIEW:
            self.held_micros += gross
        else:
            self.billed_micros += billed
            self.credited_micros += credited
            self.credited_provider_cost_micros += credited_cost


@dataclass
class Side:
    current: Position = field(default_factory=Position)
    candidate: Position = field(default_factory=Position)


@dataclass
class Change:
    runs: int = 0
    examples: list[str] = field(default_factory=list)


@dataclass
class WhatIf:
    period: str
    candidate: PolicyDocument
    runs: int = 0
    reproduced: int = 0  # runs whose replay under their own policy equals the stored decision
    not_reproduced: list[str] = field(default_factory=list)  # a few examples
    # Usage lines of a model the cost catalog has no cost for (counted at no cost).
    uncosted_lines: int = 0
    total: Side = field(default_factory=Side)
    customers: dict[str, Side] = field(default_factory=dict)
    changes: dict[tuple[str, str], Change] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Run:
    run_id: int
    subject: str
    customer: str
    abandoned: bool
    released: bool
    auto_credited_micros: int
    stored: tuple[Any, ...]  # outcome, billed, credited, line ids, rules, evidence, words
    policy_version: int
    recorded: CustomerPeriod | None
    gross_micros: int
    ended_at: datetime


def _runs(conn: psycopg.Connection[Any], tenant: str, period: str) -> Iterator[list[_Run]]:
    # One query through a server-side cursor: sorted once, fetched a batch at a time (paging
    # with a key re-sorted the period for every batch, quadratic in its runs).
    with conn.cursor(name="what_if_runs") as cursor:
        cursor.execute(RUNS, {"tenant": tenant, "period": period})
        while rows := cursor.fetchmany(BATCH):
            yield [_run(row) for row in rows]


def _run(row: tuple[Any, ...]) -> _Run:
    recorded = None
    if row[15] is not None:
        recorded = CustomerPeriod(int(row[15]), int(row[16]), int(row[17]))
    stored = (row[7], row[8], row[9], tuple(row[10]), tuple(row[11]), tuple(row[12]), row[13])
    return _Run(
        run_id=row[0],
        subject=row[1],
        customer=row[2],
        abandoned=row[4],
        released=row[5],
        auto_credited_micros=int(row[6]),
        stored=stored,
        policy_version=row[14],
        recorded=recorded,
        gross_micros=int(row[18]),
        ended_at=row[3],
    )


def _grants(conn: psycopg.Connection[Any], run_ids: list[int]) -> dict[int, list[SupportGrant]]:
    grants: dict[int, list[SupportGrant]] = {}
    for run_id, amount, covers in conn.execute(
        "SELECT run_id, amount_micros, covers_line_id FROM support_credits "
        "WHERE run_id = ANY(%s) ORDER BY run_id, grant_no",
        (run_ids,),
    ).fetchall():
        grants.setdefault(run_id, []).append(SupportGrant(amount, covers))
    return grants


def _comparable(decision: Decision) -> tuple[Any, ...]:
    return (
        decision.outcome,
        decision.billed_micros,
        decision.credited_micros,
        decision.credited_line_ids,
        decision.rule_ids,
        decision.evidence_event_ids,
        decision.explanation,
    )


@dataclass
class _Running:
    """A customer's period as the replay goes: gross so far, and the candidate's changes."""

    gross_micros: int = 0
    credited_micros: int = 0  # automatic credits so far under the policy replayed
    refunded_runs: int = 0
    credit_delta_micros: int = 0  # candidate − stored automatic credits of earlier runs
    refund_delta: int = 0


def _period(run: _Run, running: _Running, *, candidate: bool) -> CustomerPeriod:
    if run.recorded is None:
        return CustomerPeriod(
            running.gross_micros + run.gross_micros, running.credited_micros, running.refunded_runs
        )
    if not candidate:
        return run.recorded
    return CustomerPeriod(
        run.recorded.period_gross_micros,
        max(0, run.recorded.auto_credited_micros + running.credit_delta_micros),
        max(0, run.recorded.auto_refunded_runs + running.refund_delta),
    )


def _auto(decision: Decision) -> tuple[int, int]:
    """(automatic credit, automatically refunded runs) of a policy decision, as R8 counts."""
    automatic = decision.outcome in (REFUNDED, "partially_credited")
    credit = decision.credited_micros if automatic else 0
    return credit, int(decision.outcome == REFUNDED and credit > 0)


def what_if(
    conn: psycopg.Connection[Any],
    tenant: str,
    period: str,
    raw: object,
    defaults: PolicyDocument,
    now: datetime,
) -> WhatIf:
    """The what-if of ``raw`` (fields left out keep the latest version's values) over the
    tenant's runs settled in ``period`` (YYYY-MM or "current"); 422 for a bad period or
    document."""
    month = parse_period(period, now)
    latest = list_versions(conn, tenant, defaults)[-1]
    return replay_period(conn, tenant, month, parse_over(raw, latest.document), defaults)


def replay_period(
    conn: psycopg.Connection[Any],
    tenant: str,
    period: str,
    candidate: PolicyDocument,
    defaults: PolicyDocument,
) -> WhatIf:
    """Replay the tenant's runs settled in ``period`` (YYYY-MM) under ``candidate``."""
    conn.execute("SET TRANSACTION READ ONLY")
    configs: dict[int, PolicyConfig] = {
        v.version: v.document.config() for v in list_versions(conn, tenant, defaults)
    }
    config = candidate.config()
    report = WhatIf(period, candidate)
    running: dict[str, _Running] = {}
    costs = load_catalog(conn, PROVIDER_COSTS)
    for batch in _runs(conn, tenant, period):
        ids = [r.run_id for r in batch]
        evidence, grants = load_evidence(conn, ids), _grants(conn, ids)
        line_costs = _line_costs(conn, ids, costs, report)
        for run in batch:
            state = running.setdefault(run.customer, _Running())
            facts = RunFacts(
                tuple(evidence.events.get(run.run_id, ())),
                tuple(evidence.usage.get(run.run_id, ())),
                run.abandoned,
            )
            run_grants = grants.get(run.run_id, [])
            own_period = _period(run, state, candidate=False)
            own_made, own = _settle(run, facts, run_grants, configs[run.policy_version], own_period)
            new_period = _period(run, state, candidate=True)
            new_made, new = _settle(run, facts, run_grants, config, new_period)
            _tally(report, run, own, new, line_costs.get(run.run_id, {}))
            _advance(state, run, own_made, new_made)
    return report


def _settle(
    run: _Run,
    facts: RunFacts,
    grants: list[SupportGrant],
    policy: PolicyConfig,
    period: CustomerPeriod,
) -> tuple[Decision, Decision]:
    """(the policy's decision, the decision after support), as ``settle_runs`` makes them."""
    made = decide(replace(facts, period=period), policy)
    return made, apply_support(
        made,
        extra_credit_micros=covered_credit_micros(grants, facts.usage, made.credited_line_ids),
        released=run.released,
        ending=ending_of_events(facts.events),
    )


def _advance(state: _Running, run: _Run, own: Decision, new: Decision) -> None:
    own_credit, own_refund = _auto(own)
    new_credit, new_refund = _auto(new)
    stored_refund = int(run.stored[0] == REFUNDED and run.auto_credited_micros > 0)
    state.gross_micros += run.gross_micros
    state.credited_micros += own_credit
    state.refunded_runs += own_refund
    state.credit_delta_micros += new_credit - run.auto_credited_micros
    state.refund_delta += new_refund - stored_refund


USAGE_COSTED = """
SELECT run_id, id, model, input_tokens, cached_input_tokens, output_tokens, time
FROM usage_lines WHERE run_id = ANY(%(ids)s)
"""


def _line_costs(
    conn: psycopg.Connection[Any], run_ids: list[int], costs: PriceCatalog, report: WhatIf
) -> dict[int, dict[int, int]]:
    """Run id → usage line id → what the line cost the platform (0, counted, if unknown)."""
    found: dict[int, dict[int, int]] = {}
    for run_id, line_id, model, inp, cached, out, at in conn.execute(
        USAGE_COSTED, {"ids": run_ids}
    ).fetchall():
        try:
            cost = costs.price_usage(model, TokenCounts(inp, cached, out), at).total_micros
        except UnknownModelError:
            cost, report.uncosted_lines = 0, report.uncosted_lines + 1
        found.setdefault(run_id, {})[line_id] = cost
    return found


def _tally(
    report: WhatIf, run: _Run, own: Decision, new: Decision, line_costs: dict[int, int]
) -> None:
    report.runs += 1
    if _comparable(own) == run.stored:
        report.reproduced += 1
    elif len(report.not_reproduced) < EXAMPLES:
        report.not_reproduced.append(run.subject)
    side = report.customers.setdefault(run.customer, Side())
    outcome, billed, credited = run.stored[0], run.stored[1], run.stored[2]
    cost = sum(line_costs.values())
    was_credited = sum(line_costs.get(i, 0) for i in run.stored[3])
    now_credited = sum(line_costs.get(i, 0) for i in new.credited_line_ids)
    for position in (side.current, report.total.current):
        position.add(outcome, run.gross_micros, billed, credited, cost, was_credited)
    for position in (side.candidate, report.total.candidate):
        position.add(
            new.outcome,
            run.gross_micros,
            new.billed_micros,
            new.credited_micros,
            cost,
            now_credited,
        )
    if new.outcome != outcome:
        change = report.changes.setdefault((outcome, new.outcome), Change())
        change.runs += 1
        if len(change.examples) < EXAMPLES:
            change.examples.append(run.subject)
