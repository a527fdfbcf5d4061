"""The settlement use case: lock → re-read → decide → post, for a chunk of runs.

Runs in the caller's single transaction. Safe to repeat and to run concurrently: runs are
locked, and a run whose evidence has not changed since its decision in force gets no new
version, so redelivered or duplicated tasks are no-ops.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import psycopg

from metering.billing import outbox
from metering.config import Settings
from metering.ledger.postings import Position
from metering.ledger.repo import EntryRecord, RunAccount, entries_moving, insert_entries
from metering.periods import period_of, statement_period
from metering.policies.defaults import settings_policy
from metering.policies.versions import PolicyBook, PolicyVersion, load_book
from metering.policy import (
    HELD_FOR_REVIEW,
    PARTIALLY_CREDITED,
    REFUNDED,
    CustomerPeriod,
    Decision,
    PolicyConfig,
    RunFacts,
    decide,
)
from metering.policy.ending import ending_of_events
from metering.policy.support import apply_support, covered_credit_micros
from metering.settlement import repo
from metering.settlement.announce import announce_settlement
from metering.settlement.decided_facts import encode_decided_facts
from metering.settlement.due import Windows, due_at
from metering.statements.projection import LineChange, record_lines


@dataclass
class SettleReport:
    decided: dict[int, int] = field(default_factory=dict)  # run id → new version
    unchanged: list[int] = field(default_factory=list)
    not_due: list[int] = field(default_factory=list)
    records: list[repo.DecisionRecord] = field(default_factory=list)


def policy_config(settings: Settings) -> PolicyConfig:
    """What ``decide`` reads of the settings' policy (version 0 of every tenant's)."""
    return settings_policy(settings).config()


def _config(cache: dict[tuple[str, int], PolicyConfig], policy: PolicyVersion) -> PolicyConfig:
    key = (policy.tenant_id, policy.version)
    if key not in cache:
        cache[key] = policy.document.config()
    return cache[key]


def _needs_decision(
    run: repo.LockedRun, now: datetime, windows: Windows, force: bool, redecide: bool
) -> bool:
    if redecide:
        return True
    if force:
        return run.decision_version == 0 or run.evidence_version > run.settled_evidence_version
    if run.evidence_version <= run.settled_evidence_version:
        return False
    return due_at(run.clock, windows) <= now


def _windows(book: PolicyBook, tenant_id: str, now: datetime) -> Windows:
    return Windows.from_policy(book.in_force(tenant_id, now).document)


def settle_runs(
    conn: psycopg.Connection[Any],
    run_ids: Sequence[int],
    *,
    now: datetime,
    settings: Settings,
    force: bool = False,
    origin: str = "policy",
) -> SettleReport:
    """Settle the given runs that are due (all of them with ``force``, as if every window
    had passed: a run without a terminal event is then settled as abandoned).

    ``origin="support"`` re-decides every given run (support changed its credit or released
    its hold); a version is still only written when the result differs."""
    report = SettleReport()
    if not run_ids:
        return report
    repo.lock_customers(conn, run_ids)
    runs = repo.lock_runs(conn, run_ids)
    # Each tenant's windows are those of its policy in force now (as the sweep's claim).
    book = load_book(conn, {r.tenant_id for r in runs}, settings_policy(settings))
    redecide = origin == "support"
    due = [
        r
        for r in runs
        if _needs_decision(r, now, _windows(book, r.tenant_id, now), force or redecide, redecide)
    ]
    due_ids = {r.run_id for r in due}
    report.not_due = [r.run_id for r in runs if r.run_id not in due_ids]
    repo.release_claims(conn, report.not_due)
    if not due:
        return report
    ended = {r.run_id: r.clock.terminal_at or r.clock.last_event_at for r in due}
    periods = {run_id: period_of(moment) for run_id, moment in ended.items()}
    ids = [r.run_id for r in due]
    evidence = repo.load_evidence(conn, ids)
    close_delay = timedelta(seconds=settings.period_close_delay_s)
    totals = repo.load_period_totals(conn, due, periods)
    previous = repo.latest_decisions(conn, due)
    grants = repo.load_support_grants(conn, due)
    configs: dict[tuple[str, int], PolicyConfig] = {}
    entries: list[EntryRecord] = []
    unchanged: list[repo.LockedRun] = []
    decided_facts: dict[int, bytes | None] = {}
    for run in sorted(due, key=lambda r: (ended[r.run_id], r.run_id)):
        period_totals = totals[(run.tenant_id, run.customer_id, periods[run.run_id])]
        facts = RunFacts(
            events=tuple(evidence.events.get(run.run_id, ())),
            usage=tuple(evidence.usage.get(run.run_id, ())),
            abandoned=run.clock.terminal_at is None,
            period=CustomerPeriod(
                period_gross_micros=period_totals.gross_micros + run.gross_micros,
                auto_credited_micros=period_totals.auto_credited_micros,
                auto_refunded_runs=period_totals.auto_refunded_runs,
            ),
        )
        # The tenant's version in force at the run's end decides it, re-opened runs too.
        policy = book.in_force(run.tenant_id, ended[run.run_id])
        policy_decision = decide(facts, _config(configs, policy))
        if policy_decision.gross_micros != run.gross_micros:
            raise AssertionError(f"run {run.run_id}: usage lines disagree with the run's gross")
        automatic = policy_decision.outcome in (PARTIALLY_CREDITED, REFUNDED)
        auto_credit = policy_decision.credited_micros if automatic else 0
        decision = apply_support(
            policy_decision,
            extra_credit_micros=covered_credit_micros(
                grants.get(run.run_id, ()), facts.usage, policy_decision.credited_line_ids
            ),
            released=run.support_released,
            ending=ending_of_events(facts.events),
        )
        period_totals.gross_micros += run.gross_micros
        period_totals.auto_credited_micros += auto_credit
        period_totals.auto_refunded_runs += policy_decision.outcome == REFUNDED
        if previous.get(run.run_id) == _comparable(decision):
            unchanged.append(run)
            continue
        record = _record(
            run,
            decision,
            ended_at=ended[run.run_id],
            period=periods[run.run_id],
            statement=statement_period(periods[run.run_id], now, close_delay),
            usage=evidence.summaries.get(run.run_id, repo.UsageSummary()),
            auto_credit=auto_credit,
            origin=origin,
            policy_version=policy.version,
            period_inputs=facts.period,
        )
        report.records.append(record)
        report.decided[run.run_id] = record.version
        decided_facts[run.run_id] = encode_decided_facts(
            facts, tuple(evidence.pricing.get(run.run_id, ()))
        )
        entries.extend(_entries(run, record))
    report.unchanged = [r.run_id for r in unchanged]
    repo.insert_decisions(conn, report.records, decided_facts)
    insert_entries(conn, entries)
    repo.mark_settled(conn, report.records, unchanged)
    outbox.enqueue(
        conn,
        _billing_changes(due, report.records),
        unit_micros=settings.stripe_meter_unit_micros,
    )
    record_lines(conn, [line_change(record) for record in report.records], now)
    rules_in_force = {run_id: decision[4] for run_id, decision in previous.items()}
    announce_settlement(conn, due, report.records, rules_in_force, now)
    return report


def line_change(record: repo.DecisionRecord) -> LineChange:
    """What a decision puts on the customer's statement: its ledger position."""
    return LineChange(
        run_id=record.run_id,
        tenant_id=record.tenant_id,
        customer_id=record.customer_id,
        statement_period=record.statement_period,
        run_period=record.period,
        version=record.version,
        started_at=record.started_at,
        ended_at=record.ended_at,
        models=record.usage.models,
        input_tokens=record.usage.input_tokens,
        cached_input_tokens=record.usage.cached_input_tokens,
        output_tokens=record.usage.output_tokens,
        gross_micros=record.gross_micros,
        billed_micros=record.position_billed_micros,
        credited_micros=record.position_credited_micros,
        outcome=record.outcome,
        status=record.status,
        explanation=record.explanation,
    )


def _billing_changes(
    runs: Sequence[repo.LockedRun], records: Sequence[repo.DecisionRecord]
) -> list[outbox.OutboxRow]:
    """Outbox rows for decisions that change what the customer is billed (docs/stripe.md)."""
    billed_before = {r.run_id: r.billed_micros for r in runs}
    return [
        outbox.OutboxRow(
            tenant_id=d.tenant_id,
            customer_id=d.customer_id,
            run_id=d.run_id,
            decision_version=d.version,
            target_billed_micros=d.position_billed_micros,
            period=d.period,
            event_timestamp=d.ended_at,
        )
        for d in records
        if d.position_billed_micros != billed_before[d.run_id]
    ]


def _comparable(decision: Decision) -> tuple[str, int, int, tuple[int, ...], tuple[str, ...]]:
    return (
        decision.outcome,
        decision.billed_micros,
        decision.credited_micros,
        decision.credited_line_ids,
        decision.rule_ids,
    )


def _record(
    run: repo.LockedRun,
    decision: Decision,
    *,
    ended_at: datetime,
    period: str,
    statement: str,
    usage: repo.UsageSummary,
    auto_credit: int,
    origin: str,
    policy_version: int,
    period_inputs: CustomerPeriod,
) -> repo.DecisionRecord:
    # A held run is not billed: its ledger position goes (or stays) at nothing posted.
    held = decision.outcome == HELD_FOR_REVIEW
    return repo.DecisionRecord(
        run_id=run.run_id,
        version=run.decision_version + 1,
        tenant_id=run.tenant_id,
        customer_id=run.customer_id,
        origin=origin,
        outcome=decision.outcome,
        status=decision.status,
        gross_micros=decision.gross_micros,
        billed_micros=decision.billed_micros,
        credited_micros=decision.credited_micros,
        credited_line_ids=decision.credited_line_ids,
        rule_ids=decision.rule_ids,
        evidence_event_ids=decision.evidence_event_ids,
        explanation=decision.explanation,
        evidence_version=run.evidence_version,
        period=period,
        statement_period=statement,
        started_at=run.first_event_at,
        usage=usage,
        ended_at=ended_at,
        position_billed_micros=0 if held else decision.billed_micros,
        position_credited_micros=0 if held else decision.credited_micros,
        auto_credited_micros=auto_credit,
        policy_version=policy_version,
        period_inputs=period_inputs,
    )


def _entries(run: repo.LockedRun, record: repo.DecisionRecord) -> list[EntryRecord]:
    return entries_moving(
        RunAccount(run.tenant_id, run.customer_id, run.run_id),
        Position(run.billed_micros, run.credited_micros),
        Position(record.position_billed_micros, record.position_credited_micros),
        decision_version=record.version,
    )
