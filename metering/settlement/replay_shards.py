"""A what-if's replay on worker processes, all reading one snapshot of the database.

``decide`` is pure Python, so one process replays a period on one core; a period of 100,000
runs needs all of them (issue #17: in seconds, on a 2-core machine). The period's customers
are split into disjoint shards (``replay.Shard``); the calling process opens a REPEATABLE READ
transaction and exports its snapshot (``pg_export_snapshot``), and each shard is replayed by
a worker process that imports it (``SET TRANSACTION SNAPSHOT``), so every shard reads the
database as of the same instant and a run settled meanwhile cannot be counted twice or
missed. The reports are then merged.

An API process offloads every shard, a small period's only one too (``Parallelism.offload``):
replaying in Python holds the process's GIL and a core, and the other tenants' requests it
serves waited for both (issue #30: another tenant's ingest p99 ×2.31 next to one tenant's
what-ifs). The workers also lower their own priority (``os.nice``), so the OS gives the API
processes the CPU first and the replay what is left. The command line replays the first
shard itself, at its own priority: nothing else waits for it there.

The workers are shared by every tenant of the process, and one tenant's large what-if must
not hold them all while another's waits (issue #30, "Fair share"): a period offloaded is
split into shards of at most about ``shard_runs`` runs (``whatif_shard_runs``; more shards
than workers for a large one), and the shards are handed to the workers one per free worker,
the tenant with the fewest running first (``replay_pool``). Another tenant's what-if then
waits for a worker at most until one running shard ends.

Workers are spawned, not forked: the caller may be an API process with threads and pooled
connections a fork would copy. They live as long as the process, so only the first what-if
pays for their start. A what-if cancelled (its client gone, its time up) has its workers'
backends terminated: each worker connects under an ``application_name`` naming the what-if,
and the caller terminates those by name on a connection of its own.
"""

from __future__ import annotations

import contextlib
import math
import os
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, Final

import psycopg
from psycopg import IsolationLevel, sql
from psycopg.pq import TransactionStatus

from metering.config import Settings
from metering.db import SESSION_OPTIONS, terminate_backends
from metering.policy.document import PolicyDocument
from metering.settlement.replay import Shard, WhatIf, merge_reports, replay_period
from metering.settlement.replay_pool import POOL

# Below this many runs the workers' start and the merge cost more than they save.
PARALLEL_FROM_RUNS = 20_000
# An offloaded period is split into shards of about this many runs at most: another
# tenant's what-if waits for a worker at most one such shard (~1.6 s at the benchmark's
# 6,400 runs/s per process). Each shard checks its first 1,000 runs against the stored
# decisions, so smaller shards cost more checks.
SHARD_RUNS = 10_000
# How often a caller waiting for its workers looks whether the what-if was cancelled.
CANCEL_POLL_S: Final = 0.1
# A worker's backend is named this, the what-if's tag and the worker's OS pid.
WORKER_APPLICATION: Final = "fairmeter-whatif-"

COUNT = """
SELECT count(*) FROM runs
WHERE tenant_id = %(tenant)s AND period = %(period)s AND decision_version > 0
"""
What = tuple[str, str, PolicyDocument, PolicyDocument]  # tenant, period, candidate, defaults


@dataclass(frozen=True)
class Parallelism:
    """Where workers connect (a libpq URL), how many processes replay at most, and from
    how many runs in the period they share it; whether every shard is replayed by a worker
    (``offload``, the caller only holds the snapshot; then in shards of at most about
    ``shard_runs`` runs) and how much the workers lower their priority (``nice``, added to
    the caller's)."""

    conninfo: str
    processes: int
    from_runs: int = PARALLEL_FROM_RUNS
    offload: bool = False
    nice: int = 0
    shard_runs: int = SHARD_RUNS

    @classmethod
    def of(cls, settings: Settings) -> Parallelism:
        """A server's (API and console): as the settings say (``whatif_processes``, 0 is
        one per CPU; ``whatif_nice``), every shard off the request's process."""
        return cls(
            settings.libpq_url(),
            settings.whatif_processes or os.cpu_count() or 1,
            settings.whatif_parallel_from_runs,
            offload=True,
            nice=settings.whatif_nice,
            shard_runs=settings.whatif_shard_runs,
        )

    @classmethod
    def in_process(cls, settings: Settings) -> Parallelism:
        """The command line's: a small period in the calling process, a large one shared
        with workers at the caller's priority (nothing else waits for this process)."""
        processes = settings.whatif_processes or os.cpu_count() or 1
        return cls(settings.libpq_url(), processes, settings.whatif_parallel_from_runs)

    def shards(self, runs: int) -> int:
        """Into how many shards a period of ``runs`` runs is split: one per process from
        ``from_runs``; offloaded, also at most about ``shard_runs`` runs each."""
        shards = self.processes if runs >= self.from_runs else 1
        if self.offload:
            shards = max(shards, math.ceil(runs / self.shard_runs))
        return shards


@dataclass(frozen=True)
class _Job:
    """What a worker needs besides its shard: where to connect, as what, in which snapshot,
    under which limits (the caller's ``statement_timeout`` and ``lock_timeout``)."""

    conninfo: str
    tag: str
    snapshot: str
    options: str


def never_cancelled() -> bool:
    """The ``cancelled`` of a what-if nobody cancels (the command line's)."""
    return False


def replay_period_parallel(
    conn: psycopg.Connection[Any],
    tenant: str,
    period: str,
    candidate: PolicyDocument,
    defaults: PolicyDocument,
    parallelism: Parallelism,
    cancelled: Callable[[], bool] = never_cancelled,
) -> WhatIf:
    """``replay_period`` over ``conn``'s snapshot, on up to ``parallelism.processes``
    processes when the period is large enough to gain from it, and on workers only when
    ``parallelism.offload``.

    The replay runs in a transaction of its own on ``conn``, REPEATABLE READ, whose snapshot
    every shard reads: a transaction the caller opened (it can only have read, e.g. the
    policy versions, which the replay reads again) is ended first, as the isolation level
    of a transaction cannot change once it has read. Once ``cancelled()`` is true the
    workers' backends are terminated and ``psycopg.errors.QueryCanceled`` is raised, as for
    a statement cancelled in the caller.
    """
    if conn.info.transaction_status != TransactionStatus.IDLE:
        conn.rollback()
    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
    runs = conn.execute(COUNT, {"tenant": tenant, "period": period}).fetchone()
    shards = parallelism.shards(runs[0] if runs else 0)
    what = (tenant, period, candidate, defaults)
    if shards <= 1 and not parallelism.offload:
        return replay_period(conn, *what)
    job = _job(conn, parallelism.conninfo)
    first = 0 if parallelism.offload else 1  # the first shard the workers replay
    futures = _submit(job, what, range(first, shards), shards, parallelism)
    try:
        reports = [] if first == 0 else [replay_period(conn, *what, shard=Shard(0, shards))]
        for index in range(first, shards):
            future = futures.get(index)
            reports.append(_result(future, conn, what, Shard(index, shards), cancelled))
        return merge_reports(reports)
    except BaseException:
        _stop(conn, job, futures)
        raise


def _job(conn: psycopg.Connection[Any], conninfo: str) -> _Job:
    """The caller's snapshot exported, and its limits: a worker must not outlive them."""
    row = conn.execute(
        "SELECT pg_export_snapshot(), current_setting('statement_timeout'),"
        " current_setting('lock_timeout')"
    ).fetchone()
    assert row is not None
    snapshot, statement_timeout, lock_timeout = row
    limits = f"-c statement_timeout={statement_timeout} -c lock_timeout={lock_timeout}"
    return _Job(conninfo, uuid.uuid4().hex[:16], snapshot, f"{SESSION_OPTIONS} {limits}")


def _submit(
    job: _Job, what: What, indexes: range, shards: int, parallelism: Parallelism
) -> dict[int, Future[WhatIf]]:
    """The shards ``indexes`` queued for the workers, in the tenant's turn (``POOL``)."""
    # As many workers as a large period takes, at once: a small period's what-if first
    # would otherwise start a pool the next large one has to replace.
    size = max(parallelism.processes - (0 if parallelism.offload else 1), 1)
    return {
        index: POOL.submit(
            what[0], size, parallelism.nice, _replay_shard, job, what, Shard(index, shards)
        )
        for index in indexes
    }


def _result(
    future: Future[WhatIf] | None,
    conn: psycopg.Connection[Any],
    what: What,
    shard: Shard,
    cancelled: Callable[[], bool],
) -> WhatIf:
    """A worker's share, waited for until ``cancelled()``; replayed here, in the caller's
    snapshot, if its worker died (a killed worker breaks the pool for good: the next shard
    starts a new one)."""
    while future is not None:
        if cancelled():
            raise psycopg.errors.QueryCanceled("the what-if was cancelled")
        try:
            return future.result(timeout=CANCEL_POLL_S)
        except TimeoutError:
            continue
        except BrokenProcessPool:
            break
    return replay_period(conn, *what, shard=shard)


def _stop(conn: psycopg.Connection[Any], job: _Job, futures: dict[int, Future[WhatIf]]) -> None:
    """No worker goes on for a what-if that failed or was cancelled: the shards not started
    are dropped, the snapshot is released (a worker not connected yet then cannot import
    it), and the backends of those connected are terminated."""
    POOL.cancel(list(futures.values()))
    if all(future.done() for future in futures.values()):
        return
    with contextlib.suppress(psycopg.Error):  # one that cannot is closed by its owner
        conn.rollback()
    terminate_backends(job.conninfo, f"{WORKER_APPLICATION}{job.tag}-")


def _replay_shard(job: _Job, what: What, shard: Shard) -> WhatIf:
    name = f"{WORKER_APPLICATION}{job.tag}-{os.getpid()}"
    with psycopg.connect(
        job.conninfo, options=job.options, connect_timeout=10, application_name=name
    ) as conn:
        conn.isolation_level = IsolationLevel.REPEATABLE_READ
        conn.read_only = True
        conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(job.snapshot)))
        try:
            return replay_period(conn, *what, shard=shard)
        finally:
            conn.rollback()
