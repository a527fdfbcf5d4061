"""An HTTP ingest load that retries each batch until it is accepted, recording every
attempt, so a test can say what clients saw before, during and after a fault."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass(frozen=True, slots=True)
class Attempt:
    phase: str
    status: int | None  # None: no HTTP answer (connection refused, reset, timeout)
    retry_after: str | None
    seconds: float
    error: str | None = None


@dataclass
class HttpIngest:
    """Threads that POST batches to ``/v1/events``, each batch again until it is accepted
    (as a client that owns its events would), recording every attempt with the phase the
    test was in when it was sent."""

    base_url: str
    key: str
    batches: list[list[dict[str, Any]]]
    threads: int = 2
    timeout_s: float = 15.0
    pause_s: float = 0.0
    phase: str = "before"
    attempts: list[Attempt] = field(default_factory=list)
    undelivered: list[int] = field(default_factory=list)
    _next: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _workers: list[threading.Thread] = field(default_factory=list)

    def start(self) -> HttpIngest:
        for _ in range(self.threads):
            thread = threading.Thread(target=self._run, daemon=True)
            thread.start()
            self._workers.append(thread)
        return self

    def join(self, timeout_s: float) -> bool:
        """Wait until every batch is accepted; on timeout stop retrying and say False."""
        deadline = time.monotonic() + timeout_s
        for thread in self._workers:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._stop.set()
        for thread in self._workers:
            thread.join(self.timeout_s + 1)
        return not self.undelivered and not any(t.is_alive() for t in self._workers)

    def stop(self) -> None:
        """Stop retrying (threads end after their current request)."""
        self._stop.set()

    def _take(self) -> int | None:
        with self._lock:
            if self._next >= len(self.batches):
                return None
            self._next += 1
            return self._next - 1

    def _run(self) -> None:
        with httpx.Client(timeout=self.timeout_s) as client:
            while not self._stop.is_set() and (index := self._take()) is not None:
                if not self._deliver(client, self.batches[index]):
                    with self._lock:
                        self.undelivered.append(index)
                time.sleep(self.pause_s)

    def _deliver(self, client: httpx.Client, batch: list[dict[str, Any]]) -> bool:
        headers = {
            "authorization": f"Bearer {self.key}",
            "content-type": "application/cloudevents-batch+json",
        }
        while not self._stop.is_set():
            phase, began = self.phase, time.monotonic()
            try:
                reply = client.post(f"{self.base_url}/v1/events", json=batch, headers=headers)
            except httpx.HTTPError as exc:
                self._record(Attempt(phase, None, None, time.monotonic() - began, repr(exc)))
                time.sleep(0.2)
                continue
            retry_after = reply.headers.get("retry-after")
            self._record(Attempt(phase, reply.status_code, retry_after, time.monotonic() - began))
            if reply.status_code < 300:
                return True
            if reply.status_code < 500 and reply.status_code != 429:
                return False  # refused for good: the batch is undelivered, the test fails
            time.sleep(min(float(retry_after or 0.2), 1.0))
        return False

    def _record(self, attempt: Attempt) -> None:
        with self._lock:
            self.attempts.append(attempt)

    def statuses(self, phase: str | None = None) -> dict[int | None, int]:
        counts: dict[int | None, int] = {}
        for a in self.attempts:
            if phase is None or a.phase == phase:
                counts[a.status] = counts.get(a.status, 0) + 1
        return counts
