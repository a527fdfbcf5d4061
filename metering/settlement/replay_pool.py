"""The worker processes that replay what-ifs, shared by every tenant of the process, and
the fair dispatch of shards to them.

An API process replays every tenant's what-ifs on one pool of spawned workers
(``replay_shards``). A process pool's queue is first in, first out: a large what-if split
into a shard per worker and submitted at once held every worker until its last shard was
done, and another tenant's what-if, even of a few runs, waited behind all of it (issue #30:
long enough to run out of its time, a 503). So shards are not handed to the pool at once.
They wait here, in a queue per tenant, and the pool is given only as many as it has
workers; when a worker comes free it takes the next shard of the tenant with the fewest
shards running, of those equal the one served longest ago (round robin). Together with
shards of a bounded size (``Parallelism.shard_runs``), another tenant's what-if waits for a
worker at most until one running shard ends, however large the what-ifs next to it are.

A worker that dies breaks the pool for good: every shard it had, or that was waiting here,
fails with ``BrokenProcessPool`` (its caller replays it itself), and the next shard starts
a new pool.
"""

from __future__ import annotations

import atexit
import functools
import itertools
import multiprocessing
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any

from metering.worker_processes import start_worker


@dataclass(eq=False)
class _Shard:
    """A shard waiting for a worker: ``future`` is what its caller waits for."""

    tenant: str
    call: Callable[..., Any]
    args: tuple[Any, ...]
    future: Future[Any] = field(default_factory=Future)


class FairPool:
    """A process pool fed one shard per free worker, the tenant with the fewest running
    first. Thread-safe: what-ifs submit from request threads, the pool's own thread reports
    shards done."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._executor: ProcessPoolExecutor | None = None
        self._shape = (0, 0)  # size, nice: the pool wanted
        self._made = (0, 0)  # the shape of ``_executor``
        self._waiting: dict[str, deque[_Shard]] = {}
        self._running: dict[str, int] = {}
        self._served: dict[str, int] = {}  # tenant -> the turn it last got a worker
        self._pooled: dict[Future[Any], Future[Any]] = {}  # a caller's -> the pool's
        self._turns = itertools.count(1)

    def submit(
        self, tenant: str, size: int, nice: int, call: Callable[..., Any], *args: Any
    ) -> Future[Any]:
        """``call(*args)`` (picklable) on a worker of a pool of at least ``size`` workers at
        ``nice``, once it is ``tenant``'s turn. A shard whose worker dies, or that cannot be
        given to the pool, fails with ``BrokenProcessPool``; cancelling the future before a
        worker has the shard drops it."""
        shard = _Shard(tenant, call, args)
        with self._lock:
            same_nice = self._shape[1] == nice
            self._shape = (max(size, self._shape[0] if same_nice else 0), nice)
            self._waiting.setdefault(tenant, deque()).append(shard)
        self._dispatch()
        return shard.future

    def cancel(self, futures: list[Future[Any]]) -> None:
        """Drop the shards of ``futures`` no worker has started (a worker that has one goes
        on until its backend is terminated)."""
        for future in futures:
            if not future.cancel():
                with self._lock:
                    pooled = self._pooled.get(future)
                if pooled is not None:
                    pooled.cancel()

    def worker_pids(self) -> list[int]:
        """The OS pids of the pool's workers (tests kill one; the benchmark reads their
        memory)."""
        with self._lock:
            return list(getattr(self._executor, "_processes", None) or {})

    def shutdown(self) -> None:
        with self._lock:
            if self._executor is not None:
                self._retire(self._executor, cancel=True)

    def _dispatch(self) -> None:
        """Free workers given the next shards, fairly; called after every change."""
        started: list[tuple[_Shard, Future[Any], ProcessPoolExecutor]] = []
        with self._lock:
            while self._free() > 0 and (shard := self._next()) is not None:
                if not shard.future.set_running_or_notify_cancel():
                    continue  # cancelled while it waited
                executor = self._workers()
                try:
                    pooled = executor.submit(shard.call, *shard.args)
                except (BrokenProcessPool, RuntimeError) as exc:  # broken, or shut down
                    shard.future.set_exception(BrokenProcessPool(str(exc)))
                    self._retire(executor, cancel=True)
                    continue
                self._running[shard.tenant] = self._running.get(shard.tenant, 0) + 1
                self._served[shard.tenant] = next(self._turns)
                self._pooled[shard.future] = pooled
                started.append((shard, pooled, executor))
        for shard, pooled, executor in started:  # unlocked: a done one calls back at once
            pooled.add_done_callback(functools.partial(self._done, shard, executor=executor))

    def _workers(self) -> ProcessPoolExecutor:
        """The pool, of the shape wanted: a new one if it is too small, at another nice or
        broken (the shards running on an old one finish there)."""
        broken = getattr(self._executor, "_broken", False)
        if self._executor is None or broken or self._made != self._shape:
            if self._executor is not None:
                self._retire(self._executor, cancel=broken)
            self._executor = ProcessPoolExecutor(
                self._shape[0],
                mp_context=multiprocessing.get_context("spawn"),
                initializer=start_worker,
                initargs=(self._shape[1],),
            )
            self._made = self._shape
        return self._executor

    def _free(self) -> int:
        return self._shape[0] - sum(self._running.values())

    def _next(self) -> _Shard | None:
        """The first waiting shard of the tenant with the fewest shards running, of those
        the one served longest ago."""
        if not self._waiting:
            return None
        tenant = min(self._waiting, key=lambda t: (self._running.get(t, 0), self._served.get(t, 0)))
        queue = self._waiting[tenant]
        shard = queue.popleft()
        if not queue:
            del self._waiting[tenant]
        return shard

    def _done(self, shard: _Shard, done: Future[Any], *, executor: ProcessPoolExecutor) -> None:
        with self._lock:
            del self._pooled[shard.future]
            self._running[shard.tenant] -= 1
            if not self._running[shard.tenant]:
                del self._running[shard.tenant]
                if shard.tenant not in self._waiting:
                    del self._served[shard.tenant]
            if not done.cancelled() and isinstance(done.exception(), BrokenProcessPool):
                self._retire(executor, cancel=True)  # the next shard starts a new pool
        _settle(shard.future, done)
        self._dispatch()

    def _retire(self, executor: ProcessPoolExecutor, *, cancel: bool) -> None:
        """``executor`` shut down, its shards not started cancelled if ``cancel`` (else
        they run there), and forgotten if it is the current one."""
        executor.shutdown(wait=False, cancel_futures=cancel)
        if self._executor is executor:
            self._executor, self._made = None, (0, 0)


def _settle(future: Future[Any], done: Future[Any]) -> None:
    """``future`` (running) ends as the pool's ``done`` did."""
    if done.cancelled():
        future.set_exception(BrokenProcessPool("the shard was dropped before it started"))
    elif (error := done.exception()) is not None:
        future.set_exception(error)
    else:
        future.set_result(done.result())


POOL = FairPool()


@atexit.register
def _stop_workers() -> None:
    POOL.shutdown()
