"""What a settlement tells the tenant: ``run.settled`` or ``run.resettled``, ``run.held``, and
``run.status_changed`` when the words change — built for a whole chunk, recorded at once.

Per run the order is the decision, then the hold it makes, then the words that follow from
it: a receiver that sees the new words already has the decision they come from. A run
whose evidence changed but whose decision did not (a late heartbeat) gets no new version,
but its words go back from "settling again" to the decision's: that is announced too.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import psycopg

from metering.notifications.announced import remember_and_record
from metering.notifications.builders import RunRef, about_run, status_changed, timestamp
from metering.notifications.catalogue import RUN_HELD, RUN_RESETTLED, RUN_SETTLED
from metering.notifications.record import Notification
from metering.policy import HELD_FOR_REVIEW
from metering.policy.status import run_status
from metering.settlement.due import ParkedRun
from metering.settlement.repo import DecisionRecord, LockedRun

# What ``run.resettled`` compares between the position before and after, by payload name.
COMPARED = ("outcome", "billed_micros", "credited_micros", "held_micros", "rule_ids")


def announce_settlement(
    conn: psycopg.Connection[Any],
    runs: Sequence[LockedRun],
    records: Sequence[DecisionRecord],
    rules_in_force: dict[int, tuple[str, ...]],
    now: datetime,
) -> None:
    """Record the chunk's notifications (one statement) and the runs' new words.

    ``runs`` are the runs settled (a new version or not), ``rules_in_force`` the rule ids of
    the decision each already-decided one had."""
    decided = {record.run_id: record for record in records}
    notifications: list[Notification] = []
    announced: list[tuple[int, str]] = []
    for run in runs:
        ref = RunRef(run.tenant_id, run.customer_id, run.run_id, run.subject)
        record = decided.get(run.run_id)
        if record is not None:
            before = position_before(run, rules_in_force.get(run.run_id, ()))
            notifications += _decision_notifications(ref, run, record, before, now)
        words = run_status(
            parked=run.parked,
            reopened=False,  # this settlement saw every event the run has
            decided=record.status if record is not None else run.status,
            live=_no_live_words,
        )
        if words != run.announced_status:
            notifications.append(status_changed(ref, words, run.announced_status, now))
            announced.append((run.run_id, words))
    if notifications:
        remember_and_record(conn, announced, notifications)


def _no_live_words() -> str:
    raise AssertionError("a settled run has its decision's words")


def _decision_notifications(
    ref: RunRef, run: LockedRun, record: DecisionRecord, before: dict[str, Any], now: datetime
) -> list[Notification]:
    after = position_after(record)
    fields: dict[str, Any] = {
        "decision_version": record.version,
        "origin": record.origin,
        "status": record.status,
        "gross_micros": record.gross_micros,
        **after,
        "explanation": record.explanation,
        "decided_at": timestamp(now),
    }
    if run.decision_version == 0:
        found = [about_run(ref, RUN_SETTLED, **fields)]
    else:
        changes = {
            name: {"before": before[name], "after": after[name]}
            for name in COMPARED
            if before[name] != after[name]
        }
        found = [
            about_run(
                ref,
                RUN_RESETTLED,
                **fields,
                previous_decision_version=run.decision_version,
                changes=changes,
            )
        ]
    if record.outcome == HELD_FOR_REVIEW and run.outcome != HELD_FOR_REVIEW:
        found.append(
            about_run(
                ref,
                RUN_HELD,
                decision_version=record.version,
                held_micros=after["held_micros"],
                rule_ids=list(record.rule_ids),
                explanation=record.explanation,
            )
        )
    return found


def position_after(record: DecisionRecord) -> dict[str, Any]:
    """The run as the run page shows it after ``record``: its ledger position (a held run
    has nothing billed or credited yet) and the rules that made it."""
    billed, credited = record.position_billed_micros, record.position_credited_micros
    return {
        "outcome": record.outcome,
        "billed_micros": billed,
        "credited_micros": credited,
        "held_micros": record.gross_micros - billed - credited,
        "rule_ids": list(record.rule_ids),
    }


def position_before(run: LockedRun, rule_ids: Sequence[str]) -> dict[str, Any]:
    """The run as the run page showed it just before: usage that arrived since the decision
    in force is held, as ``metering.runs.ledger_position`` says."""
    return {
        "outcome": run.outcome,
        "billed_micros": run.billed_micros,
        "credited_micros": run.credited_micros,
        "held_micros": run.gross_micros - run.billed_micros - run.credited_micros,
        "rule_ids": list(rule_ids),
    }


def announce_parked(
    conn: psycopg.Connection[Any], parked: Sequence[ParkedRun], now: datetime
) -> None:
    """Runs parked after repeated settlement failures are under review: say so."""
    words = run_status(parked=True, reopened=False, decided=None, live=_no_live_words)
    changed = [run for run in parked if run.announced_status != words]
    if not changed:
        return
    remember_and_record(
        conn,
        [(run.run_id, words) for run in changed],
        [
            status_changed(
                RunRef(run.tenant_id, run.customer_id, run.run_id, run.subject),
                words,
                run.announced_status,
                now,
            )
            for run in changed
        ],
    )
