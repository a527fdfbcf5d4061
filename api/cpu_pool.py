"""A request's CPU-heavy work in other processes, at a lower CPU priority.

Pure Python holds its process's GIL: an OTLP export's decode, mapping, validation, pricing
and row building (~0.5 s for 2,048 spans, ~1.2 s as OTLP/JSON) run on a thread of the API
process held up every other request of that process meanwhile, another tenant's single
events among them (issue #30, docs/reliability.md "Ingest next to a tenant's heavy
requests"). Here that work runs in worker processes (api/otlp_work.py: a large export is
stored from the worker too), each of which lowered its priority by ``heavy_cpu_nice`` when
it started: the OS gives the API processes the CPU first, and the heavy work what is left.

One pool per API process, started with the first piece of work (most processes never see a
large export), ``otlp_cpu_processes`` workers at most. Workers are spawned, never forked:
the API process has threads and pooled connections a fork would copy. A worker that dies (a
kill, the OOM killer) breaks the pool for good; the work it had is then done in the calling
thread, once, and the next piece of work starts a new pool — never a 500, never lost spans.
The workers end with their API process (``metering/worker_processes.py``).
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass
from typing import Any, Final, TypeVar

import psycopg

from metering.config import Settings
from metering.db import QueryGuard
from metering.errors import MeteringError
from metering.worker_processes import start_worker

T = TypeVar("T")

# How often a caller waiting for a worker looks whether its client is gone (or its time is
# up), as api/heavy.py repeats a cancel request.
GUARD_POLL_S: Final = 0.2


@dataclass(frozen=True)
class _Refusal:
    """A ``MeteringError`` raised in a worker, as fields: a dataclass exception whose fields
    were given by keyword does not unpickle (its ``args`` are empty)."""

    fields: dict[str, Any]


def _refusing(work: Callable[..., T], *args: Any) -> T | _Refusal:
    """``work(*args)`` in a worker, a ``MeteringError`` handed back as a value."""
    try:
        return work(*args)
    except MeteringError as refusal:
        return _Refusal(asdict(refusal))


class CpuPool:
    """Worker processes for one API process; :meth:`run` is called from worker threads."""

    def __init__(self, processes: int, nice: int) -> None:
        self.processes = processes
        self.nice = nice
        self._lock = threading.Lock()
        self._executor: ProcessPoolExecutor | None = None

    def run(
        self,
        guard: QueryGuard,
        work: Callable[..., T],
        *args: Any,
        on_cancel: Callable[[], None] | None = None,
    ) -> T:
        """``work(*args)`` (a module-level function; picklable arguments and result) in a
        worker, its ``MeteringError`` raised here. When ``guard`` is cancelled (the client
        is gone, the time is up) before the result is in, work not yet started is dropped,
        work started is stopped by ``on_cancel`` (which ends its database work: what it was
        storing rolls back), and ``QueryCanceled`` is raised (a 503 through api/heavy.py)."""
        executor = self._workers()
        try:
            future = executor.submit(_refusing, work, *args)
            outcome = self._awaited(future, guard, on_cancel)
        except BrokenProcessPool:  # at submit, or while the worker had it
            self._drop(executor)
            return work(*args)
        if isinstance(outcome, _Refusal):
            raise MeteringError(**outcome.fields)
        return outcome

    def _awaited(
        self,
        future: Future[T | _Refusal],
        guard: QueryGuard,
        on_cancel: Callable[[], None] | None,
    ) -> T | _Refusal:
        while not wait([future], timeout=GUARD_POLL_S).done:
            if guard.cancelled:
                # only if no worker has taken it yet; else its result is dropped
                if not future.cancel() and on_cancel is not None:
                    on_cancel()
                raise psycopg.errors.QueryCanceled("the request was cancelled: not stored")
        return future.result()

    def _workers(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ProcessPoolExecutor(
                    self.processes,
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=start_worker,
                    initargs=(self.nice,),
                )
            return self._executor

    def _drop(self, executor: ProcessPoolExecutor | None) -> None:
        """Forget ``executor`` (broken) unless another thread already has; the next piece of
        work starts a new pool."""
        with self._lock:
            if executor is None or self._executor is not executor:
                return
            self._executor = None
        executor.shutdown(wait=False, cancel_futures=True)

    def shutdown(self) -> None:
        self._drop(self._executor)


_pool: CpuPool | None = None
_pool_lock = threading.Lock()


def cpu_pool(settings: Settings) -> CpuPool:
    """This process's pool (``otlp_cpu_processes`` workers; 0: one per CPU and at least one
    more than a tenant may export at once), made on the first call; its workers start with
    the first piece of work.

    The workers are shared by every tenant of the process, first come, first served, and a
    tenant runs at most ``otlp_concurrent_exports_per_tenant`` exports at once across the
    processes: with one worker more than that, one tenant's exports never hold every worker,
    and another tenant's large export starts at once."""
    global _pool
    with _pool_lock:
        if _pool is None:
            per_tenant = settings.otlp_concurrent_exports_per_tenant
            processes = settings.otlp_cpu_processes or max(os.cpu_count() or 1, per_tenant + 1)
            _pool = CpuPool(processes, settings.heavy_cpu_nice)
        return _pool


@atexit.register
def _stop_workers() -> None:
    if _pool is not None:
        _pool.shutdown()
