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

Workers are spawned, not forked: the caller may be an API process with threads and pooled
connections a fork would copy. They live as long as the process, so only the first what-if
pays for their start. A what-if cancelled (its client gone, its time up) has its workers'
backends terminated: each worker connects under an ``application_name`` naming the what-if,
and the caller terminates those by name on a connection of its own.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import os
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, Final

import psycopg
from psycopg import IsolationLevel, sql
from psycopg.pq import TransactionStatus

from metering.config import Settings
from metering.db import SESSION_OPTIONS
from metering.policy.document import PolicyDocument
from metering.settlement.replay import Shard, WhatIf, merge_reports, replay_period
from metering.worker_processes import start_worker

# Below this many runs the workers' start and the merge cost more than they save.
PARALLEL_FROM_RUNS = 20_000
# How often a caller waiting for its workers looks whether the what-if was cancelled.
CANCEL_POLL_S: Final = 0.1
# A worker's backend is named this, the what-if's tag and the worker's OS pid.
WORKER_APPLICATION: Final = "fairmeter-whatif-"

COUNT = """
SELECT count(*) FROM runs
WHERE tenant_id = %(tenant)s AND period = %(period)s AND decision_version > 0
"""
TERMINATE = """
SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name LIKE %s
"""

What = tuple[str, str, PolicyDocument, PolicyDocument]  # tenant, period, candidate, defaults


@dataclass(frozen=True)
class Parallelism:
    """Where workers connect (a libpq URL), how many processes replay at most, and from
    how many runs in the period they share it; whether every shard is replayed by a worker
    (``offload``, the caller only holds the snapshot) and how much the workers lower their
    priority (``nice``, added to the caller's)."""

    conninfo: str
    processes: int
    from_runs: int = PARALLEL_FROM_RUNS
    offload: bool = False
    nice: int = 0

    @classmethod
    def of(cls, settings: Settings) -> Parallelism:
        """A server's (API and console): as the settings say (``whatif_processes``, 0 is
        one per CPU; ``whatif_nice``), every shard off the request's process."""
        processes = settings.whatif_processes or os.cpu_count() or 1
        return cls(settings.libpq_url(), processes, offload=True, nice=settings.whatif_nice)

    @classmethod
    def in_process(cls, settings: Settings) -> Parallelism:
        """The command line's: a small period in the calling process, a large one shared
        with workers at the caller's priority (nothing else waits for this process)."""
        processes = settings.whatif_processes or os.cpu_count() or 1
        return cls(settings.libpq_url(), processes)


@dataclass(frozen=True)
class _Job:
    """What a worker needs besides its shard: where to connect, as what, in which snapshot,
    under which limits (the caller's ``statement_timeout`` and ``lock_timeout``)."""

    conninfo: str
    tag: str
    snapshot: str
    options: str


_pool: ProcessPoolExecutor | None = None
_pool_shape = (0, 0)  # size, nice
_pool_lock = threading.Lock()


def _workers(size: int, nice: int) -> ProcessPoolExecutor:
    global _pool, _pool_shape
    with _pool_lock:
        too_small = _pool_shape[0] < size or _pool_shape[1] != nice
        if _pool is None or too_small or getattr(_pool, "_broken", False):
            if _pool is not None:
                _pool.shutdown(wait=False)
            _pool = ProcessPoolExecutor(
                size,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=start_worker,
                initargs=(nice,),
            )
            _pool_shape = (size, nice)
        return _pool


@atexit.register
def _stop_workers() -> None:
    if _pool is not None:
        _pool.shutdown(wait=False, cancel_futures=True)


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
    shards = parallelism.processes if runs and runs[0] >= parallelism.from_runs else 1
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
    """The shards ``indexes`` sent to the workers; none when the pool is broken (a dead
    worker broke it while they were being sent): the caller replays them then."""
    # As many workers as a large period takes, at once: a small period's what-if first
    # would otherwise start a pool the next large one has to replace.
    size = max(parallelism.processes - (0 if parallelism.offload else 1), 1)
    futures: dict[int, Future[WhatIf]] = {}
    try:
        pool = _workers(size, parallelism.nice)
        for index in indexes:
            futures[index] = pool.submit(_replay_shard, job, what, Shard(index, shards))
    except BrokenProcessPool:
        _drop_workers()
    return futures


def _result(
    future: Future[WhatIf] | None,
    conn: psycopg.Connection[Any],
    what: What,
    shard: Shard,
    cancelled: Callable[[], bool],
) -> WhatIf:
    """A worker's share, waited for until ``cancelled()``; replayed here, in the caller's
    snapshot, if its worker died (a killed worker breaks the pool for good: it is dropped,
    the next what-if starts anew)."""
    while future is not None:
        if cancelled():
            raise psycopg.errors.QueryCanceled("the what-if was cancelled")
        try:
            return future.result(timeout=CANCEL_POLL_S)
        except TimeoutError:
            continue
        except BrokenProcessPool:
            _drop_workers()
            break
    return replay_period(conn, *what, shard=shard)


def _stop(conn: psycopg.Connection[Any], job: _Job, futures: dict[int, Future[WhatIf]]) -> None:
    """No worker goes on for a what-if that failed or was cancelled: the shards not started
    are dropped, the snapshot is released (a worker not connected yet then cannot import
    it), and the backends of those connected are terminated."""
    for future in futures.values():
        future.cancel()
    if all(future.done() for future in futures.values()):
        return
    with contextlib.suppress(psycopg.Error):  # one that cannot is closed by its owner
        conn.rollback()
    pattern = f"{WORKER_APPLICATION}{job.tag}-%"
    # On a connection of its own: the request's may be being cancelled meanwhile. Out of
    # reach of the database, the workers' statement_timeout still ends them.
    with (
        contextlib.suppress(psycopg.Error),
        psycopg.connect(job.conninfo, autocommit=True, connect_timeout=10) as admin,
    ):
        admin.execute(TERMINATE, (pattern,))


def _drop_workers() -> None:
    global _pool, _pool_shape
    with _pool_lock:
        if _pool is not None:
            _pool.shutdown(wait=False, cancel_futures=True)
        _pool, _pool_shape = None, (0, 0)


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
