"""``Meter``: the client's entry point — a durable spool, a flusher thread and run helpers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType

import httpx

from fairmeter_client import events as ev
from fairmeter_client.errors import MeterConfigError
from fairmeter_client.events import Draft
from fairmeter_client.flusher import Flusher
from fairmeter_client.run import Run
from fairmeter_client.spool import DeadLetter, Spool
from fairmeter_client.sqlite import Synchronous
from fairmeter_client.transport import Backoff, Transport

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class MeterStats:
    pending_events: int  # spooled, not yet committed by the server
    pending_bytes: int
    dead_letters: int  # refused by the server; see Meter.dead_letters()
    accepted: int  # by the server, since this Meter started
    duplicates: int  # events the server already had (resent after a lost reply)
    last_failure: str | None  # the last failed delivery, None once one succeeds
    config_error: MeterConfigError | None


class Meter:
    """Reports runs to Fairmeter through a local spool; see the package docstring.

    Thread-safe: any number of threads may report through one Meter. One process per
    ``spool_path``. Events already in the spool (from an earlier process) are sent on start.

    ``max_events`` / ``max_spool_bytes`` bound pending events plus dead letters
    (``SpoolFullError`` beyond). ``max_batch_events`` / ``max_batch_bytes`` size the
    requests (the server's limits by default). ``backoff_base_s`` doubles per failed
    attempt up to ``max_backoff_s``. ``synchronous``: ``"FULL"`` fsyncs every event (survives
    power loss), ``"NORMAL"`` survives process crashes only. ``dedupe_window_s`` /
    ``max_known_ids``: how long / how many delivered ids are remembered to answer a repeated
    call with the same id without sending. ``start=False`` spools without sending until
    :meth:`start`. ``http_client`` replaces the default ``httpx.Client`` (proxies, TLS).
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        source: str,
        spool_path: str | Path,
        max_spool_bytes: int = 64 * MIB,
        max_events: int = 100_000,
        timeout_s: float = 10.0,
        max_batch_events: int = 1000,
        max_batch_bytes: int = MIB,
        backoff_base_s: float = 0.5,
        max_backoff_s: float = 30.0,
        synchronous: Synchronous = "FULL",
        dedupe_window_s: float = 86_400.0,
        max_known_ids: int = 200_000,
        lock_timeout_s: float = 5.0,
        start: bool = True,
        http_client: httpx.Client | None = None,
    ) -> None:
        self.source = ev.text("source", source)
        self._spool = Spool(
            spool_path,
            max_events=max_events,
            max_bytes=max_spool_bytes,
            synchronous=synchronous,
            dedupe_window_s=dedupe_window_s,
            max_known_ids=max_known_ids,
            lock_timeout_s=lock_timeout_s,
        )
        self._transport = Transport(base_url, api_key, timeout_s=timeout_s, http_client=http_client)
        self._flusher = Flusher(
            self._spool,
            self._transport,
            Backoff(backoff_base_s, max_backoff_s),
            max_batch_events=max_batch_events,
            max_batch_bytes=max_batch_bytes,
        )
        self._timeout_s = timeout_s
        self._closed = False
        if start:
            self.start()

    def run(self, run_id: str, *, customer: str, attempt: int = 1) -> Run:
        """A reporter for one run (usable with or without ``with``)."""
        return Run(self, run_id, customer=customer, attempt=attempt)

    def record(self, run: str, customer: str, draft: Draft) -> str:
        """Spool one event durably and wake the flusher; the event's id."""
        if self._closed:
            raise RuntimeError("this Meter is closed")

        def make(seq: int | None) -> dict[str, object]:
            return ev.to_cloudevent(
                draft,
                source=self.source,
                run=run,
                customer=customer,
                seq=seq,
                now=datetime.now(UTC),
            )

        sequence = (run, draft.type) if draft.sequenced else None
        event_id = self._spool.append(self.source, make, sequence)
        self._flusher.notify()
        return event_id

    def start(self) -> None:
        """Start the flusher thread (done by the constructor unless ``start=False``)."""
        self._flusher.start()

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every event spooled so far is delivered (or dead-lettered).

        True when done, False when ``timeout`` seconds passed first (e.g. the API is down:
        the events stay spooled and keep being retried). Raises :class:`MeterConfigError`
        when the server refuses the client itself (bad key, scope or URL).
        """
        target = self._spool.last_seq()
        self._flusher.notify()
        return self._flusher.wait_until_sent(target, timeout)

    def close(self, timeout: float = 10.0) -> bool:
        """Flush for up to ``timeout`` seconds, stop the thread, close the spool.

        Returns whether everything was sent; what was not stays in the spool for the next
        process. Never raises for delivery problems.
        """
        if self._closed:
            return True
        self._closed = True
        try:
            sent = self.flush(timeout)
        except MeterConfigError:
            sent = False
        stopped = self._flusher.stop(self._timeout_s + 1.0)
        if stopped:
            self._transport.close()
        self._spool.close()
        return sent

    def resume(self) -> None:
        """Send again after a :class:`MeterConfigError` once the configuration is fixed."""
        self._flusher.resume()

    @property
    def config_error(self) -> MeterConfigError | None:
        return self._flusher.config_error

    def stats(self) -> MeterStats:
        totals = self._spool.totals()
        return MeterStats(
            pending_events=totals.pending_events,
            pending_bytes=totals.pending_bytes,
            dead_letters=totals.dead_letters,
            accepted=self._flusher.accepted,
            duplicates=self._flusher.duplicates,
            last_failure=self._flusher.last_failure,
            config_error=self._flusher.config_error,
        )

    def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        """Events the server refused (oldest first), with its ``code`` and ``errors``."""
        return self._spool.dead_letters(limit)

    def requeue_dead_letters(self, event_ids: Sequence[str] | None = None) -> int:
        """Queue dead letters (all, or these ids) again, e.g. after a price catalog fix."""
        moved = self._spool.requeue_dead_letters(event_ids)
        self._flusher.notify()
        return moved

    def discard_dead_letters(self, event_ids: Sequence[str] | None = None) -> int:
        """Delete dead letters (all, or these ids) for good, freeing spool space."""
        return self._spool.discard_dead_letters(event_ids)

    def __enter__(self) -> Meter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
