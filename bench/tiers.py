"""CPU seconds spent by each tier (API, worker, PostgreSQL) over a phase of a benchmark.

A shared, noisy machine changes how fast work goes, not how much CPU it takes: CPU-seconds
per unit of work (read from /proc through psutil) is what a capacity model can be built
on. Processes come and go during a phase (PostgreSQL backends of pool overflow, prefork
children replaced), so the tiers' processes are sampled every ``interval_s`` in a thread:
a process first seen after the phase began is counted from zero, and one that exits loses
at most the CPU of its last interval.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil
import psycopg

Finder = Callable[[], list[psutil.Process]]


def process_tree(pid: int) -> list[psutil.Process]:
    """A process and all its descendants (uvicorn's or celery's workers)."""
    try:
        parent = psutil.Process(pid)
        return [parent, *parent.children(recursive=True)]
    except psutil.Error:
        return []


class PostgresProcesses:
    """Finds PostgreSQL's processes through ``pg_stat_activity`` (local server only), over
    one connection kept open: a connection per sample would cost the machine a backend's
    start four times a second. Used from one thread at a time (TierCpu's)."""

    def __init__(self, server_url: str) -> None:
        self.server_url = server_url
        self._conn: psycopg.Connection[Any] | None = None

    def backends(self, database: str) -> Finder:
        """Every backend working for ``database``: client sessions, their parallel workers
        and the autovacuum workers it gets. The sampler's own is left out."""
        return lambda: self._find("datname = %s", (database,))

    def background(self) -> Finder:
        """The server's own processes (WAL writer, checkpointer, background writer,
        autovacuum launcher): they work for every database on the server, so their CPU over
        a phase is an upper bound of the share the benchmark caused."""
        return lambda: self._find("datname IS NULL", ())

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _find(self, where: str, params: tuple[object, ...]) -> list[psutil.Process]:
        query = f"SELECT pid FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND {where}"
        try:
            if self._conn is None or self._conn.closed:
                self._conn = psycopg.connect(self.server_url, autocommit=True)
            rows = self._conn.execute(query.encode(), params).fetchall()
        except psycopg.Error:
            self.close()
            return []
        found = []
        for (pid,) in rows:
            try:
                found.append(psutil.Process(int(pid)))
            except psutil.Error:
                continue
        return found


@dataclass
class _Seen:
    base_s: float
    last_s: float


@dataclass
class TierCpu:
    """Start it, do the work, stop it: CPU seconds per tier meanwhile (``totals``)."""

    tiers: dict[str, Finder]
    interval_s: float = 0.25
    seen: dict[str, dict[tuple[int, float], _Seen]] = field(default_factory=dict)
    started_at: float = 0.0
    elapsed_s: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _thread: threading.Thread | None = None

    def start(self) -> TierCpu:
        self.started_at = time.time()
        self.seen = {name: {} for name in self.tiers}
        self._sample(first=True)
        self._thread = threading.Thread(target=self._run, name="tier-cpu", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> dict[str, float]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample(first=False)
        self.elapsed_s = time.time() - self.started_at
        return self.totals()

    def totals(self) -> dict[str, float]:
        """So far (any thread may ask while the phase runs), or over the phase once stopped."""
        with self._lock:
            return {
                name: sum(s.last_s - s.base_s for s in procs.values())
                for name, procs in self.seen.items()
            }

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample(first=False)

    def _sample(self, *, first: bool) -> None:
        for name, find in self.tiers.items():
            known = self.seen[name]
            for proc in find():
                try:
                    key = (proc.pid, proc.create_time())
                    times = proc.cpu_times()
                except psutil.Error:
                    continue
                now_s = times.user + times.system
                with self._lock:
                    self._note(known, key, now_s, first=first)

    @staticmethod
    def _note(
        known: dict[tuple[int, float], _Seen], key: tuple[int, float], now_s: float, *, first: bool
    ) -> None:
        if key in known:
            known[key].last_s = now_s
        else:
            # The first sample lists every process the tier had: one seen later was born
            # inside the phase (a process's start time is too coarse to tell, psutil
            # derives it from the boot time in whole seconds).
            known[key] = _Seen(now_s if first else 0.0, now_s)
