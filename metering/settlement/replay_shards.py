"""A large what-if on several processes, all reading one snapshot of the database.

``decide`` is pure Python, so one process replays a period on one core; a period of 100,000
runs needs all of them (issue #17: in seconds, on a 2-core machine). The period's customers
are split into disjoint shards (``replay.Shard``); the calling process replays the first in
its own transaction and exports that transaction's snapshot (``pg_export_snapshot``), and
each other shard is replayed by a worker process that imports the snapshot
(``SET TRANSACTION SNAPSHOT``), so every shard reads the database as of the same instant and
a run settled meanwhile cannot be counted twice or missed. The reports are then merged.

Workers are spawned, not forked: the caller may be an API process with threads and pooled
connections a fork would copy. They live as long as the process, so only the first large
what-if pays for their start.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import threading
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import IsolationLevel, sql
from psycopg.pq import TransactionStatus

from metering.config import Settings
from metering.db import SESSION_OPTIONS
from metering.policy.document import PolicyDocument
from metering.settlement.replay import Shard, WhatIf, merge_reports, replay_period

# Below this many runs the workers' start and the merge cost more than they save.
PARALLEL_FROM_RUNS = 20_000

COUNT = """
SELECT count(*) FROM runs
WHERE tenant_id = %(tenant)s AND period = %(period)s AND decision_version > 0
"""


@dataclass(frozen=True)
class Parallelism:
    """Where workers connect (a libpq URL), how many processes replay at most, and from
    how many runs in the period they do."""

    conninfo: str
    processes: int
    from_runs: int = PARALLEL_FROM_RUNS

    @classmethod
    def of(cls, settings: Settings) -> Parallelism:
        """As the settings say (``whatif_processes``; 0 is one per CPU)."""
        processes = settings.whatif_processes or os.cpu_count() or 1
        return cls(settings.libpq_url(), processes)


_pool: ProcessPoolExecutor | None = None
_pool_size = 0
_pool_lock = threading.Lock()


def _workers(size: int) -> ProcessPoolExecutor:
    global _pool, _pool_size
    with _pool_lock:
        if _pool is None or _pool_size < size or getattr(_pool, "_broken", False):
            if _pool is not None:
                _pool.shutdown(wait=False)
            _pool = ProcessPoolExecutor(size, mp_context=multiprocessing.get_context("spawn"))
            _pool_size = size
        return _pool


@atexit.register
def _stop_workers() -> None:
    if _pool is not None:
        _pool.shutdown(wait=False, cancel_futures=True)


def replay_period_parallel(
    conn: psycopg.Connection[Any],
    tenant: str,
    period: str,
    candidate: PolicyDocument,
    defaults: PolicyDocument,
    parallelism: Parallelism,
) -> WhatIf:
    """``replay_period`` over ``conn``'s transaction, on up to ``parallelism.processes``
    processes when the period is large enough to gain from it.

    The replay runs in a transaction of its own on ``conn``, REPEATABLE READ, whose snapshot
    every shard reads: a transaction the caller opened (it can only have read, e.g. the
    policy versions, which the replay reads again) is ended first, as the isolation level
    of a transaction cannot change once it has read.
    """
    if conn.info.transaction_status != TransactionStatus.IDLE:
        conn.rollback()
    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
    runs = conn.execute(COUNT, {"tenant": tenant, "period": period}).fetchone()
    shards = parallelism.processes if runs and runs[0] >= parallelism.from_runs else 1
    if shards <= 1:
        return replay_period(conn, tenant, period, candidate, defaults)
    snapshot = conn.execute("SELECT pg_export_snapshot()").fetchone()
    assert snapshot is not None
    what = (tenant, period, candidate, defaults)
    futures: dict[int, Future[WhatIf]] = {}
    try:
        pool = _workers(shards - 1)
        for index in range(1, shards):
            shard = Shard(index, shards)
            futures[index] = pool.submit(
                _replay_shard, parallelism.conninfo, snapshot[0], what, shard
            )
    except BrokenProcessPool:
        _drop_workers()  # submitting to a pool a dead worker broke: the shares run here
    try:
        reports = [replay_period(conn, *what, shard=Shard(0, shards))]
        for index in range(1, shards):
            reports.append(_result(futures.get(index), conn, what, Shard(index, shards)))
        return merge_reports(reports)
    finally:
        for future in futures.values():
            future.cancel()


def _result(
    future: Future[WhatIf] | None,
    conn: psycopg.Connection[Any],
    what: tuple[str, str, PolicyDocument, PolicyDocument],
    shard: Shard,
) -> WhatIf:
    """A worker's share; replayed here, in the caller's snapshot, if its worker died (a
    killed worker breaks the pool for good: it is dropped, the next what-if starts anew)."""
    if future is not None:
        try:
            return future.result()
        except BrokenProcessPool:
            _drop_workers()
    return replay_period(conn, *what, shard=shard)


def _drop_workers() -> None:
    global _pool, _pool_size
    with _pool_lock:
        if _pool is not None:
            _pool.shutdown(wait=False, cancel_futures=True)
        _pool, _pool_size = None, 0


def _replay_shard(
    conninfo: str,
    snapshot: str,
    what: tuple[str, str, PolicyDocument, PolicyDocument],
    shard: Shard,
) -> WhatIf:
    tenant, period, candidate, defaults = what
    with psycopg.connect(conninfo, options=SESSION_OPTIONS, connect_timeout=10) as conn:
        conn.isolation_level = IsolationLevel.REPEATABLE_READ
        conn.read_only = True
        conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot)))
        try:
            return replay_period(conn, tenant, period, candidate, defaults, shard=shard)
        finally:
            conn.rollback()
