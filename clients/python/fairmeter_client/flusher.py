"""The background thread that drains the spool to the API, in spool order.

One batch at a time (so the server sees events in spool order), each as large as the
limits allow. What happens to a batch depends on the reply:

* 2xx — committed: removed from the queue.
* network error, 408/425/429, 5xx — sent again, unchanged, after a jittered exponential
  backoff that never undercuts ``Retry-After``. Resending is safe: ids are stable and the
  server answers "duplicate" for what it already has.
* 413 — bisected until the pieces fit.
* 422, 409 and other 4xx — the server rejects a batch as a whole, so the batch is
  bisected until the bad events are alone; those go to the dead letters with the server's
  problem details and everything else is delivered.
* 401/403/404/405/3xx — the configuration is wrong for every event: sending stops, the
  events stay queued and the error is raised by ``flush()`` until ``resume()``.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time

from fairmeter_client.errors import MeterConfigError
from fairmeter_client.spool import Spool, Spooled
from fairmeter_client.transport import Backoff, Reply, Transport, Verdict

log = logging.getLogger("fairmeter.client")


class Flusher:
    def __init__(
        self,
        spool: Spool,
        transport: Transport,
        backoff: Backoff,
        *,
        max_batch_events: int,
        max_batch_bytes: int,
        prune_interval_s: float = 60.0,
    ) -> None:
        self._spool = spool
        self._transport = transport
        self._backoff = backoff
        self._max_batch_events = max_batch_events
        self._max_batch_bytes = max_batch_bytes
        self._prune_interval_s = prune_interval_s
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._progress = threading.Condition()
        self._thread: threading.Thread | None = None
        self.config_error: MeterConfigError | None = None
        self.accepted = 0
        self.duplicates = 0
        self.last_failure: str | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="fairmeter-flusher", daemon=True)
            self._thread.start()

    def notify(self) -> None:
        """New events are in the spool."""
        self._wake.set()

    def resume(self) -> None:
        """Clear a configuration error and try sending again."""
        self.config_error = None
        self._backoff.reset()
        self._wake.set()

    def wait_until_sent(self, seq: int, timeout_s: float) -> bool:
        """Wait until no event up to ``seq`` is pending (delivered or dead-lettered)."""
        deadline = time.monotonic() + timeout_s
        with self._progress:
            while True:
                if self.config_error is not None:
                    raise self.config_error
                if not self._spool.pending_through(seq):
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._thread is None:  # nobody would make progress
                    return False
                self._progress.wait(min(remaining, 0.5))

    def stop(self, timeout_s: float) -> bool:
        """Stop the thread; False when it is still busy (an HTTP request) after the timeout."""
        self._stop.set()
        self._wake.set()
        if self._thread is None:
            return True
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    # -- the thread ----------------------------------------------------------------------

    def _run(self) -> None:
        next_prune = time.monotonic()
        while not self._stop.is_set():
            self._wake.clear()  # before reading the queue, so no append is missed
            try:
                if time.monotonic() >= next_prune:
                    self._spool.prune()
                    next_prune = time.monotonic() + self._prune_interval_s
                delay = self._cycle()
            except sqlite3.ProgrammingError:  # the spool was closed under a stuck request
                return
            except Exception:  # a full disk, a broken file: keep the thread alive, back off
                log.exception("fairmeter: the spool flusher failed; retrying")
                delay = self._backoff.next_delay()
            with self._progress:
                self._progress.notify_all()
            if delay is None:
                self._wake.wait(self._prune_interval_s)
            elif delay > 0:
                self._stop.wait(delay)

    def _cycle(self) -> float | None:
        """Send one batch; the seconds to wait before the next (``None``: until woken)."""
        if self.config_error is not None:
            return None
        batch = self._spool.next_batch(self._max_batch_events, self._max_batch_bytes)
        if not batch:
            return None
        reply = self._deliver(batch)
        if reply is None:
            self._backoff.reset()
            self.last_failure = None
            return 0.0
        self.last_failure = f"{reply.status or 'network'} {reply.code}: {reply.detail}"
        if reply.verdict is Verdict.CONFIGURATION:
            self.config_error = MeterConfigError(reply.status or 0, reply.code, reply.detail)
            log.error("fairmeter: sending stopped, events kept: %s", self.last_failure)
            return None
        delay = self._backoff.next_delay(reply.retry_after_s)
        failures = self._backoff.failures
        level = logging.WARNING if failures == 1 or failures % 20 == 0 else logging.DEBUG
        log.log(
            level,
            "fairmeter: delivery failed %d time(s) (%s); retrying in %.1fs",
            failures,
            self.last_failure,
            delay,
        )
        return delay

    def _deliver(self, batch: list[Spooled]) -> Reply | None:
        """Deliver ``batch`` or isolate its bad events; a reply only when it must wait/stop."""
        reply = self._transport.send([item.body for item in batch])
        if reply.verdict is Verdict.DELIVERED:
            self._spool.mark_delivered(batch)
            self.accepted += reply.accepted
            self.duplicates += reply.duplicates
            return None
        if reply.verdict in (Verdict.RETRY, Verdict.CONFIGURATION):
            return reply
        if len(batch) == 1:
            self._spool.dead_letter(batch[0], reply.status, reply.problem)
            log.warning(
                "fairmeter: event %s dead-lettered: %s %s",
                batch[0].event_id,
                reply.code,
                reply.detail,
            )
            return None
        middle = len(batch) // 2
        for half in (batch[:middle], batch[middle:]):
            outcome = self._deliver(half)
            if outcome is not None:
                return outcome
        return None
