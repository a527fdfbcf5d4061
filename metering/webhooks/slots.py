"""A delivery round's bookkeeping: the messages it holds leased, its send slots, and its
finished attempts waiting to be recorded.

Fair share of a round's threads: at most ``per_endpoint`` sends at once to one endpoint,
endpoints taken in turn, and the last ``threads // 4`` threads kept for endpoints that have
no send running (an endpoint's first send may take any free thread, its further ones only
those above the reserve): however many receivers hang at once, a prompt endpoint's message
finds a thread as soon as a send ends, not after the hanging ones time out.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from sqlalchemy.engine import Engine

from metering.config import Settings
from metering.db import raw_transaction
from metering.webhooks import breaker
from metering.webhooks.attempts import Attempt, Claimed, record, record_delivered

# Finished attempts are recorded once this many are waiting, or this long after the first.
RECORD_BATCH = 16
RECORD_EVERY_S = 0.05


class Held:
    """The (message, attempt) pairs a round holds, for its heartbeat."""

    def __init__(self) -> None:
        self._pairs: dict[int, int] = {}
        self._lock = threading.Lock()

    def add(self, messages: Sequence[Claimed]) -> None:
        with self._lock:
            self._pairs.update((m.id, m.attempt) for m in messages)

    def drop(self, message: Claimed) -> None:
        with self._lock:
            self._pairs.pop(message.id, None)

    def pairs(self) -> list[tuple[int, int]]:
        with self._lock:
            return list(self._pairs.items())


class SendSlots:
    """Claimed messages waiting for a send, per endpoint, and the sends running."""

    def __init__(self, threads: int, per_endpoint: int) -> None:
        self._threads = threads
        self._per_endpoint = per_endpoint
        self._reserve = threads // 4
        self._waiting: dict[str, deque[Claimed]] = {}
        self._sending: Counter[str] = Counter()
        self.running: set[Future[tuple[Claimed, Attempt]]] = set()
        # An endpoint's claimed messages all went to send since the last claim: it may
        # have more due, so claiming again is worth its cost now.
        self.drained = False

    @property
    def held(self) -> int:
        """Messages claimed and not yet finished (waiting or being sent)."""
        return len(self.running) + sum(len(q) for q in self._waiting.values())

    @property
    def busy(self) -> int:
        """Sends running, and those that could start now: what keeps the round's threads
        busy. (A message waiting for its endpoint's slots does not: a hanging receiver's
        backlog must not stop the round claiming for the others.)"""
        startable = sum(1 for e, queue in self._waiting.items() if queue and self._may_start(e))
        return len(self.running) + startable

    def _may_start(self, endpoint: str) -> bool:
        free = self._threads - len(self.running)
        if free <= 0:
            return False
        if self._sending[endpoint] == 0:
            return True
        return self._sending[endpoint] < self._per_endpoint and free > self._reserve

    def add(self, messages: Sequence[Claimed]) -> None:
        for message in messages:
            self._waiting.setdefault(message.endpoint_id, deque()).append(message)

    def take_waiting(self, endpoints: set[str] | None = None) -> list[Claimed]:
        """The messages of ``endpoints`` (all when ``None``) waiting for a send, taken out:
        the round lets them go instead of holding them."""
        taken: list[Claimed] = []
        for endpoint, queue in self._waiting.items():
            if endpoints is None or endpoint in endpoints:
                taken.extend(queue)
                queue.clear()
        return taken

    def start(
        self, pool: ThreadPoolExecutor, one: Callable[[Claimed], tuple[Claimed, Attempt]]
    ) -> None:
        """Send what may be sent now, one message per endpoint per turn."""
        while True:
            ready = [e for e, queue in self._waiting.items() if queue and self._may_start(e)]
            if not ready:
                return
            for endpoint in ready:
                if not self._may_start(endpoint):
                    continue
                message = self._waiting[endpoint].popleft()
                self.drained = self.drained or not self._waiting[endpoint]
                self._sending[endpoint] += 1
                self.running.add(pool.submit(one, message))

    def finished(self, attempts: Sequence[tuple[Claimed, Attempt]]) -> None:
        for message, _ in attempts:
            self._sending[message.endpoint_id] -= 1


class Recorder:
    """Finished attempts, recorded together a few at a time or after RECORD_EVERY_S (one
    transaction per finished send was the round's serial bottleneck): the delivered ones
    by :func:`record_delivered`, the others one by one by :func:`record`."""

    def __init__(self, engine: Engine, settings: Settings, held: Held) -> None:
        self._engine = engine
        self._settings = settings
        self._held = held
        self._unrecorded: list[tuple[Claimed, Attempt]] = []
        self._first_at = 0.0
        self._tripped: set[str] = set()

    @property
    def pending(self) -> bool:
        return bool(self._unrecorded)

    def add(self, attempts: list[tuple[Claimed, Attempt]]) -> bool:
        """Keep the attempts; record them all when it is time (at once when one tripped its
        endpoint's breaker: the round must not send that endpoint's next message first).
        Whether it was."""
        if attempts and not self._unrecorded:
            self._first_at = time.monotonic()
        self._unrecorded.extend(attempts)
        if self._unrecorded and (
            len(self._unrecorded) >= RECORD_BATCH
            or time.monotonic() - self._first_at >= RECORD_EVERY_S
            or any(_tripped(result) for _, result in attempts)
        ):
            self.flush()
            return True
        return False

    def tripped(self) -> set[str]:
        """The endpoints whose attempts failed in the last records: their breakers count."""
        tripped, self._tripped = self._tripped, set()
        return tripped

    def flush(self) -> None:
        done = self._unrecorded
        if not done:
            return
        with raw_transaction(self._engine) as conn:
            record_delivered(conn, [a for a in done if a[1].delivered])
            for message, result in done:
                if not result.delivered:
                    record(conn, message, result, self._settings)
        for message, result in done:
            self._held.drop(message)
            if _tripped(result):
                self._tripped.add(message.endpoint_id)
        self._unrecorded = []


def _tripped(result: Attempt) -> bool:
    return not result.delivered and breaker.trips(result.status_code, result.error)
