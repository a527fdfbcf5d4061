"""Transactions around settlement, for the task wrapper, the CLI and the API.

Each function owns its transactions (one per use case) and returns after commit, so the
caller may then send messages about what was committed.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from sqlalchemy.engine import Engine

from metering.config import Settings
from metering.db import raw_transaction
from metering.leases import Heartbeat, elapsed_since
from metering.policies.defaults import settings_policy
from metering.policies.versions import load_book
from metering.settlement.announce import announce_parked
from metering.settlement.due import (
    ParkedRun,
    Windows,
    chunk_by_customer,
    claim_due_runs,
    hold_runs,
    park_poison_runs,
)
from metering.settlement.settle import SettleReport, settle_runs

log = logging.getLogger("fairmeter.settlement")


def now_utc() -> datetime:
    return datetime.now(UTC)


def claim_due_chunks(
    engine: Engine, settings: Settings, now: datetime | None = None
) -> list[list[int]]:
    """Park poison runs, claim due runs, and return them as chunks for the workers."""
    now = now or now_utc()
    with raw_transaction(engine) as conn:
        parked = park_poison_runs(conn, now, settings.max_settle_attempts)
        announce_parked(conn, parked, now)
        defaults = Windows.from_settings(settings)
        claimed = claim_due_runs(
            conn,
            now,
            defaults,
            limit=settings.sweep_batch_size,
            lease=timedelta(seconds=settings.claim_lease_s),
            tenant_windows=tenant_windows(conn, settings, defaults, now),
        )
    _report_parked(parked)
    return chunk_by_customer(claimed, settings.settle_chunk_size)


def tenant_windows(
    conn: psycopg.Connection[Any], settings: Settings, defaults: Windows, now: datetime
) -> dict[str, Windows]:
    """The tenants whose policy in force now sets windows other than the deployment's, and
    theirs: a run is due by its tenant's windows (settle grace, resume window, idle timeout).
    Read at every sweep: only tenants that ever wrote a policy are looked at."""
    tenants = [r[0] for r in conn.execute("SELECT DISTINCT tenant_id FROM policy_versions")]
    if not tenants:
        return {}
    book = load_book(conn, tenants, settings_policy(settings))
    found = {t: Windows.from_policy(book.in_force(t, now).document) for t in tenants}
    return {t: w for t, w in found.items() if w != defaults}


def _report_parked(parked: list[ParkedRun]) -> None:
    for run in parked:
        log.error(
            "run parked after repeated settlement failures",
            extra={"run_id": run.run_id, "tenant": run.tenant_id, "run": run.subject},
        )


def settle_chunk(
    engine: Engine, settings: Settings, run_ids: list[int], now: datetime | None = None
) -> SettleReport:
    """Settle a chunk in one transaction; if that fails, each run alone, so one poison run
    cannot hold up the others (it stays claimed, its attempts count up, and it is parked).

    The chunk's runs are held on ``settle_hold_lease_s``, renewed while this runs: if the
    process dies, another worker's sweep claims them again one short lease later, not when
    the sweep's ``claim_lease_s`` for the queued chunk runs out (issue #13 §7). A run that
    failed keeps the hold it had and is retried when it ends."""
    now = now or now_utc()
    with Heartbeat(
        lambda until: _hold(engine, run_ids, until),
        timedelta(seconds=settings.settle_hold_lease_s),
        elapsed_since(now),
        name="settle-chunk",
    ):
        return _settle_chunk(engine, settings, run_ids, now)


def _hold(engine: Engine, run_ids: list[int], until: datetime) -> None:
    with raw_transaction(engine) as conn:
        hold_runs(conn, run_ids, until)


def _settle_chunk(
    engine: Engine, settings: Settings, run_ids: list[int], now: datetime
) -> SettleReport:
    try:
        with raw_transaction(engine) as conn:
            return settle_runs(conn, run_ids, now=now, settings=settings)
    except Exception:
        if len(run_ids) == 1:
            raise
        log.exception("chunk settlement failed; settling its runs one by one")
    merged = SettleReport()
    for run_id in run_ids:
        try:
            with raw_transaction(engine) as conn:
                report = settle_runs(conn, [run_id], now=now, settings=settings)
        except Exception:
            log.exception("settlement failed", extra={"run_id": run_id})
            continue
        merged.decided.update(report.decided)
        merged.unchanged += report.unchanged
        merged.not_due += report.not_due
        merged.records += report.records
    return merged


def settle_due_now(engine: Engine, settings: Settings, now: datetime | None = None) -> SettleReport:
    """A whole sweep in this process (``fairmeter settle --due``), chunk after chunk."""
    merged = SettleReport()
    while chunks := claim_due_chunks(engine, settings, now):
        progress = 0
        for chunk in chunks:
            report = settle_chunk(engine, settings, chunk, now)
            merged.decided.update(report.decided)
            merged.unchanged += report.unchanged
            progress += len(report.decided) + len(report.unchanged)
        if progress == 0:  # only failures or runs that stopped being due: stop here
            break
    return merged
