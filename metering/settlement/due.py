"""When a run is due for settlement (docs/policy.md), and claiming due runs for the workers.

A run is due at the earliest of: terminal event + ``settle_grace``; an open
``connection.lost`` + ``resume_window`` (open = no restore, resume or usage after it); last
event + ``idle_timeout``. Only runs with evidence no decision has seen are considered, so a
late event re-opens a settled run by itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg

from metering.config import Settings
from metering.policy.document import PolicyDocument


@dataclass(frozen=True, slots=True)
class Windows:
    settle_grace: timedelta
    resume_window: timedelta
    idle_timeout: timedelta

    @classmethod
    def from_settings(cls, settings: Settings) -> Windows:
        return cls(
            timedelta(seconds=settings.settle_grace_s),
            timedelta(seconds=settings.resume_window_s),
            timedelta(seconds=settings.idle_timeout_s),
        )

    @classmethod
    def from_policy(cls, policy: PolicyDocument) -> Windows:
        return cls(
            timedelta(seconds=policy.settle_grace_s),
            timedelta(seconds=policy.resume_window_s),
            timedelta(seconds=policy.idle_timeout_s),
        )


@dataclass(frozen=True, slots=True)
class RunClock:
    """The times of a run that decide when it is due."""

    terminal_at: datetime | None
    last_event_at: datetime
    last_lost_at: datetime | None
    last_recovered_at: datetime | None

    @property
    def drop_is_open(self) -> bool:
        if self.last_lost_at is None:
            return False
        return self.last_recovered_at is None or self.last_recovered_at < self.last_lost_at


def due_at(clock: RunClock, windows: Windows) -> datetime:
    """Pure: the moment the run becomes due. ``IS_DUE_SQL`` asks the same in SQL."""
    candidates = [clock.last_event_at + windows.idle_timeout]
    if clock.terminal_at is not None:
        candidates.append(clock.terminal_at + windows.settle_grace)
    if clock.drop_is_open and clock.last_lost_at is not None:
        candidates.append(clock.last_lost_at + windows.resume_window)
    return min(candidates)


# ``due_at(clock) <= now`` as a disjunction with one range per clock, so each branch is a
# scan of its own partial index (``ix_runs_pending*``) and a sweep reads only due runs;
# LEAST(...) <= now, the same test, made PostgreSQL evaluate it for every pending run.
# The cut-offs are now minus each window (``cutoff_params``). A test checks it against
# ``due_at`` over random clocks.
IS_DUE_SQL = """
(runs.last_event_at <= %(idle_cutoff)s
 OR runs.terminal_at <= %(grace_cutoff)s
 OR (runs.last_lost_at <= %(resume_cutoff)s
     AND (runs.last_recovered_at IS NULL OR runs.last_recovered_at < runs.last_lost_at)))
"""

# Attempts are counted by claims and reset with them (claimed_until and settle_attempts
# are set and cleared together), so a run with attempts has a claim, and an expired
# claim is a range of ``ix_runs_pending_claimed_until``. A run locked by a settlement
# transaction is being tried right now (its hold is not renewed while locked): it is
# skipped, not waited for, so a sweep never stalls behind a slow chunk.
# By an id array, as the claim below: a join with the CTE may hash-scan every stored run.
PARK_POISON_RUNS = """
WITH poison AS (
    SELECT id FROM runs
    WHERE settled_evidence_version < evidence_version AND parked_at IS NULL
      AND claimed_until < %(now)s
      AND settle_attempts >= %(max_attempts)s
    FOR UPDATE SKIP LOCKED
)
UPDATE runs SET parked_at = %(now)s,
       parked_reason = 'settlement failed ' || settle_attempts || ' times in a row'
WHERE runs.id = ANY(ARRAY(SELECT id FROM poison))
RETURNING runs.id, runs.tenant_id, runs.subject, runs.customer_id, runs.announced_status
"""

# Sweeps take this lock in their transaction, so they claim one after the other: two sweeps
# claiming at once would split a customer's due runs between their chunks.
SWEEP_LOCK_KEY = 0x5EE9_0000

# A customer with runs still in flight (claimed, lease running, not settled) is left for a
# later sweep: a second chunk of theirs could otherwise be settled before the first, out of
# end-time order, and R8 reads the customer's earlier decisions.
# (NOT IN, not NOT EXISTS: it becomes one hashed subplan whatever the row estimates; both
# columns are NOT NULL.) The claimed runs are updated by an id array, not ``FROM due``: the
# planner estimates ``due`` at its LIMIT and, joining it as a table, hashed a sequential
# scan of every stored run (issue #18); ``id = ANY(array)`` is a probe of ``pk_runs`` per
# due run, so a sweep costs the same whatever the settled history. Ids are unique alone.
# The due runs are found one clock at a time, each a range of its own partial index, and
# probed by key (``id = ANY(ARRAY(...))``): as one disjunction the planner estimated the
# ranges from the whole table's statistics, where settled runs keep clocks long past, judged
# most pending runs due and read them all through ``ix_runs_pending`` (the growth bench:
# 211,787 read to claim 2,000, twice the CPU; tests/integration/test_sweep_claim_plan.py).
_PENDING = "settled_evidence_version < evidence_version AND parked_at IS NULL"  # the indexes'
DUE_RUN_IDS = f"""
SELECT id FROM runs WHERE {_PENDING} AND runs.last_event_at <= %(idle_cutoff)s
UNION
SELECT id FROM runs WHERE {_PENDING} AND runs.terminal_at <= %(grace_cutoff)s
UNION
SELECT id FROM runs WHERE {_PENDING} AND runs.last_lost_at <= %(resume_cutoff)s
    AND (runs.last_recovered_at IS NULL OR runs.last_recovered_at < runs.last_lost_at)
"""

CLAIM_DUE_RUNS = f"""
WITH due AS (
    SELECT id FROM runs
    WHERE id = ANY(ARRAY({DUE_RUN_IDS}))
      AND settled_evidence_version < evidence_version AND parked_at IS NULL
      AND (claimed_until IS NULL OR claimed_until < %(now)s)
      AND {IS_DUE_SQL}
      AND (%(only)s::text[] IS NULL OR tenant_id = ANY(%(only)s::text[]))
      AND tenant_id <> ALL(%(elsewhere)s::text[])
      AND (tenant_id, customer_id) NOT IN (
          SELECT tenant_id, customer_id FROM runs
          WHERE settled_evidence_version < evidence_version AND parked_at IS NULL
            AND claimed_until >= %(now)s
      )
    ORDER BY COALESCE(terminal_at, last_event_at), id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE runs SET claimed_until = %(lease_until)s, settle_attempts = settle_attempts + 1
WHERE runs.id = ANY(ARRAY(SELECT id FROM due))
RETURNING runs.id, runs.tenant_id, runs.customer_id, COALESCE(terminal_at, last_event_at)
"""


# A worker that starts a chunk holds its runs on a lease of its own, short and renewed while
# it works (``metering/leases.py``), instead of the sweep's: that one must outlast the wait
# in the broker's queue, which nobody renews. Rows locked by a settlement transaction are
# skipped, not waited for: the sweep skips them too (SKIP LOCKED), so the lock holds them.
HOLD_RUNS = """
UPDATE runs SET claimed_until = %(until)s
WHERE id IN (
    SELECT id FROM runs
    WHERE id = ANY(%(ids)s) AND claimed_until IS NOT NULL
      AND settled_evidence_version < evidence_version AND parked_at IS NULL
    FOR UPDATE SKIP LOCKED
)
"""


@dataclass(frozen=True, slots=True)
class ClaimedRun:
    run_id: int
    tenant_id: str
    customer_id: str
    ended_at: datetime


@dataclass(frozen=True, slots=True)
class ParkedRun:
    run_id: int
    tenant_id: str
    subject: str
    customer_id: str
    announced_status: str | None


def cutoff_params(windows: Windows, now: datetime) -> dict[str, datetime]:
    """The ``IS_DUE_SQL`` parameters: a clock at or before its cut-off makes a run due."""
    return {
        "idle_cutoff": now - windows.idle_timeout,
        "grace_cutoff": now - windows.settle_grace,
        "resume_cutoff": now - windows.resume_window,
    }


def claim_params(
    now: datetime,
    windows: Windows,
    *,
    limit: int,
    lease: timedelta,
    only: list[str] | None = None,
    elsewhere: list[str] | None = None,
) -> dict[str, Any]:
    """One pass's ``CLAIM_DUE_RUNS`` parameters: runs due by ``windows`` of the tenants in
    ``only`` (all when None) but not in ``elsewhere``. Named once, so the plan test and the
    growth bench EXPLAIN the claim with the parameters the sweep binds."""
    return {
        "now": now,
        "limit": limit,
        "lease_until": now + lease,
        "only": only,
        "elsewhere": elsewhere or [],
        **cutoff_params(windows, now),
    }


def park_poison_runs(
    conn: psycopg.Connection[Any], now: datetime, max_attempts: int
) -> list[ParkedRun]:
    """Runs whose settlement failed ``max_attempts`` times stop being retried (and are reported)."""
    rows = conn.execute(PARK_POISON_RUNS, {"now": now, "max_attempts": max_attempts}).fetchall()
    return [ParkedRun(*row) for row in rows]


def claim_due_runs(
    conn: psycopg.Connection[Any],
    now: datetime,
    windows: Windows,
    *,
    limit: int,
    lease: timedelta,
    tenant_windows: dict[str, Windows] | None = None,
) -> list[ClaimedRun]:
    """Claim up to ``limit`` due runs for ``lease``; a claim that is never settled expires.

    ``windows`` are the deployment's; ``tenant_windows`` those of tenants whose policy in
    force sets others (their runs are due by their own). Waits for any other sweep's claim
    to commit, and skips customers with runs in flight, so a customer's runs are never in
    two chunks at once (see ``CLAIM_DUE_RUNS``).
    """
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (SWEEP_LOCK_KEY,))
    # No JIT: with a million runs stored the planner's cost for the claim passes
    # jit_above_cost, and compiling took 64 ms of a 264 ms claim that reads 2,000 rows (the
    # growth bench, 2 December): most of what the history added to the sweep.
    conn.execute("SET LOCAL jit = off")
    own = tenant_windows or {}
    groups: dict[Windows, list[str]] = {}
    for tenant, tenant_window in own.items():
        groups.setdefault(tenant_window, []).append(tenant)
    claimed: list[ClaimedRun] = []
    passes: list[tuple[Windows, list[str] | None, list[str]]] = [(windows, None, sorted(own))]
    passes += [(w, sorted(tenants), []) for w, tenants in groups.items()]
    for pass_windows, only, elsewhere in passes:
        left = limit - len(claimed)
        if left <= 0:
            break
        params = claim_params(
            now, pass_windows, limit=left, lease=lease, only=only, elsewhere=elsewhere
        )
        claimed += [ClaimedRun(*row) for row in conn.execute(CLAIM_DUE_RUNS, params).fetchall()]
    claimed.sort(key=lambda c: (c.ended_at, c.run_id))
    return claimed


def hold_runs(conn: psycopg.Connection[Any], run_ids: list[int], until: datetime) -> None:
    """Move the claims of ``run_ids`` still unsettled to end at ``until`` (see ``HOLD_RUNS``)."""
    conn.execute(HOLD_RUNS, {"ids": run_ids, "until": until})


def chunk_by_customer(claimed: list[ClaimedRun], size: int) -> list[list[int]]:
    """Chunks of run ids; a customer's runs stay together and in end-time order (R8)."""
    by_customer: dict[tuple[str, str], list[ClaimedRun]] = {}
    for run in claimed:
        by_customer.setdefault((run.tenant_id, run.customer_id), []).append(run)
    chunks: list[list[int]] = []
    current: list[int] = []
    for runs in by_customer.values():
        if current and len(current) + len(runs) > size:
            chunks.append(current)
            current = []
        current.extend(r.run_id for r in runs)
    if current:
        chunks.append(current)
    return chunks
