"""The durable spool: a local SQLite file that holds every event until the server has it.

Durability: an event is committed to the spool before the reporting call returns. The file
is in WAL mode with ``synchronous=FULL`` by default, so every commit is fsynced and a
returned call survives a power cut, not only a crashed or killed process. ``NORMAL`` (also
offered) skips that fsync and may lose the last commits on power loss or an OS crash; the
events are billing evidence and a model call takes seconds, so one fsync per event (1-6 ms
measured on a loaded VM disk, against 0.3 ms with NORMAL) is the better default; a very
chatty reporter may choose NORMAL knowingly.

One process per spool: the connection takes SQLite's exclusive lock (``locking_mode =
EXCLUSIVE``), so a second live process gets :class:`SpoolLockedError` instead of sending the
same events twice. The operating system drops the lock when a process dies, even by SIGKILL.

Tables: ``queue`` (pending events; ``seq`` is the spool order, never reused), ``dead_letters``
(events the server refused, with its problem details), ``known_ids`` (every id reported
recently and its content hash: local idempotency) and ``sequences`` (per-run counters for
events without a natural key). ``max_events`` / ``max_spool_bytes`` bound the queue plus the
dead letters (payload bytes; SQLite's pages and the WAL come on top). ``known_ids`` and
``sequences`` are pruned after ``dedupe_window_s`` (and ``known_ids`` beyond ``max_known_ids``,
oldest delivered first): a call repeated later than that gets its old id again but a new
``time``, which the server answers with 409 (a dead letter) unless the caller passed ``at``.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fairmeter_client.errors import EventConflictError, SpoolFullError
from fairmeter_client.ids import content_hash
from fairmeter_client.sqlite import BUMP_SEQUENCE, READ_SEQUENCE, Synchronous, open_spool

EventMaker = Callable[[int | None], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Spooled:
    """One pending event as read for sending."""

    seq: int
    source: str
    event_id: str
    body: str
    size: int


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """An event the server refused for good, with its problem details (``code``, ``errors``)."""

    seq: int
    source: str
    event_id: str
    event: dict[str, Any]
    status: int | None
    code: str
    detail: str
    errors: list[dict[str, Any]]
    problem: dict[str, Any]
    dead_at: float


@dataclass(frozen=True, slots=True)
class SpoolTotals:
    pending_events: int
    pending_bytes: int
    dead_letters: int
    dead_letter_bytes: int


class Spool:
    """Thread-safe: one connection, one lock; every method is one short transaction."""

    def __init__(
        self,
        path: str | Path,
        *,
        max_events: int,
        max_bytes: int,
        synchronous: Synchronous = "FULL",
        dedupe_window_s: float = 86_400.0,
        max_known_ids: int = 200_000,
        lock_timeout_s: float = 5.0,
    ) -> None:
        if synchronous not in ("FULL", "NORMAL"):
            raise ValueError("synchronous must be FULL or NORMAL")
        self.path = Path(path)
        self.max_events = max_events
        self.max_bytes = max_bytes
        self.dedupe_window_s = dedupe_window_s
        self.max_known_ids = max_known_ids
        self._lock = threading.RLock()
        self._conn = open_spool(self.path, synchronous, lock_timeout_s)
        self._events, self._bytes = self._count_stored()

    # -- writing -------------------------------------------------------------------------

    def append(self, source: str, make: EventMaker, sequence: tuple[str, str] | None) -> str:
        """Store the event ``make(seq)`` builds, once per id; return its id.

        ``sequence`` = ``(run, name)`` draws the next per-run counter value for ``make``.
        Raises :class:`EventConflictError` when the id is known with other content and
        :class:`SpoolFullError` when the bounds would be exceeded.
        """
        now = time.time()
        with self._transaction() as conn:
            seq = None
            if sequence is not None:
                conn.execute(BUMP_SEQUENCE, (source, *sequence, now))
                seq = conn.execute(READ_SEQUENCE, (source, *sequence)).fetchone()[0]
            event = make(seq)
            digest = content_hash(event)
            known = conn.execute(
                "SELECT content_hash FROM known_ids WHERE source = ? AND event_id = ?",
                (source, event["id"]),
            ).fetchone()
            if known is not None:
                if known[0] != digest:
                    raise EventConflictError(
                        f"event {event['id']} ({event['type']} of run {event['subject']}) was "
                        "already reported with different content; give distinct events a "
                        "distinct key (step, tool_call_id or key=)"
                    )
                return str(event["id"])
            body = json.dumps(event, separators=(",", ":"), ensure_ascii=False)
            size = len(body.encode())
            self._check_room(size)
            conn.execute(
                "INSERT INTO queue (source, event_id, body, size, enqueued_at) "
                "VALUES (?, ?, ?, ?, ?)",
                (source, event["id"], body, size, now),
            )
            conn.execute(
                "INSERT INTO known_ids (source, event_id, content_hash, created_at) "
                "VALUES (?, ?, ?, ?)",
                (source, event["id"], digest, now),
            )
            self._events += 1
            self._bytes += size
        return str(event["id"])

    def _check_room(self, size: int) -> None:
        if self._events + 1 > self.max_events:
            raise SpoolFullError(
                f"the spool holds {self._events} events (max_events={self.max_events}); "
                "is the API reachable? are dead letters piling up?"
            )
        if self._bytes + size > self.max_bytes:
            raise SpoolFullError(
                f"the spool holds {self._bytes} bytes of events "
                f"(max_spool_bytes={self.max_bytes}); is the API reachable?"
            )

    def mark_delivered(self, items: Sequence[Spooled]) -> None:
        """The server committed ``items``: drop them from the queue, remember their ids."""
        now = time.time()
        with self._transaction() as conn:
            conn.executemany("DELETE FROM queue WHERE seq = ?", [(i.seq,) for i in items])
            conn.executemany(
                "UPDATE known_ids SET delivered_at = ? WHERE source = ? AND event_id = ?",
                [(now, i.source, i.event_id) for i in items],
            )
            self._events -= len(items)
            self._bytes -= sum(i.size for i in items)

    def dead_letter(self, item: Spooled, status: int | None, problem: dict[str, Any]) -> None:
        """Move ``item`` out of the queue into the dead letters, with the server's problem."""
        with self._transaction() as conn:
            conn.execute(
                "INSERT INTO dead_letters (seq, source, event_id, body, size, status, code, "
                "detail, problem, dead_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    item.seq,
                    item.source,
                    item.event_id,
                    item.body,
                    item.size,
                    status,
                    str(problem.get("code", "rejected")),
                    str(problem.get("detail", "")),
                    json.dumps(problem),
                    time.time(),
                ),
            )
            conn.execute("DELETE FROM queue WHERE seq = ?", (item.seq,))

    # -- reading -------------------------------------------------------------------------

    def next_batch(self, max_events: int, max_bytes: int) -> list[Spooled]:
        """The oldest pending events, in spool order, that fit one batch request body."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT seq, source, event_id, body, size FROM queue ORDER BY seq LIMIT ?",
                (max_events,),
            ).fetchall()
        batch: list[Spooled] = []
        body_bytes = 2  # the brackets of the JSON array
        for row in rows:
            item = Spooled(*row)
            body_bytes += item.size + (1 if batch else 0)
            if batch and body_bytes > max_bytes:
                break
            batch.append(item)
        return batch

    def last_seq(self) -> int:
        with self._lock:
            row = self._conn.execute("SELECT max(seq) FROM queue").fetchone()
        return int(row[0] or 0)

    def pending_through(self, seq: int) -> bool:
        """Is any event spooled at or before ``seq`` still waiting to be sent?"""
        with self._lock:
            row = self._conn.execute("SELECT 1 FROM queue WHERE seq <= ? LIMIT 1", (seq,))
            return row.fetchone() is not None

    def totals(self) -> SpoolTotals:
        with self._lock:
            pending, pending_bytes = self._conn.execute(
                "SELECT count(*), coalesce(sum(size), 0) FROM queue"
            ).fetchone()
            dead, dead_bytes = self._conn.execute(
                "SELECT count(*), coalesce(sum(size), 0) FROM dead_letters"
            ).fetchone()
        return SpoolTotals(pending, pending_bytes, dead, dead_bytes)

    def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT seq, source, event_id, body, status, code, detail, problem, dead_at "
                "FROM dead_letters ORDER BY seq LIMIT ?",
                (limit,),
            ).fetchall()
        letters = []
        for seq, source, event_id, body, status, code, detail, problem_json, dead_at in rows:
            problem = json.loads(problem_json)
            errors = problem.get("errors")
            letters.append(
                DeadLetter(
                    seq=seq,
                    source=source,
                    event_id=event_id,
                    event=json.loads(body),
                    status=status,
                    code=code,
                    detail=detail,
                    errors=errors if isinstance(errors, list) else [],
                    problem=problem,
                    dead_at=dead_at,
                )
            )
        return letters

    # -- dead-letter handling and housekeeping -------------------------------------------

    def requeue_dead_letters(self, event_ids: Sequence[str] | None = None) -> int:
        """Send dead letters again (e.g. after a model was added to the price catalog)."""
        where, params = _id_filter(event_ids)
        with self._transaction() as conn:
            moved = conn.execute(
                "INSERT INTO queue (source, event_id, body, size, enqueued_at) "
                f"SELECT source, event_id, body, size, ? FROM dead_letters {where} ORDER BY seq",
                (time.time(), *params),
            ).rowcount
            conn.execute(f"DELETE FROM dead_letters {where}", params)
        return moved

    def discard_dead_letters(self, event_ids: Sequence[str] | None = None) -> int:
        where, params = _id_filter(event_ids)
        with self._transaction() as conn:
            size = conn.execute(
                f"SELECT coalesce(sum(size), 0) FROM dead_letters {where}", params
            ).fetchone()[0]
            removed = conn.execute(f"DELETE FROM dead_letters {where}", params).rowcount
            self._events -= removed
            self._bytes -= size
        return removed

    def prune(self) -> None:
        """Forget delivered ids and idle sequences older than the dedupe window."""
        cutoff = time.time() - self.dedupe_window_s
        with self._transaction() as conn:
            conn.execute("DELETE FROM known_ids WHERE delivered_at < ?", (cutoff,))
            conn.execute("DELETE FROM sequences WHERE updated_at < ?", (cutoff,))
            excess = conn.execute("SELECT count(*) FROM known_ids").fetchone()[0]
            excess -= self.max_known_ids
            if excess > 0:
                conn.execute(
                    "DELETE FROM known_ids WHERE (source, event_id) IN (SELECT source, "
                    "event_id FROM known_ids WHERE delivered_at IS NOT NULL "
                    "ORDER BY delivered_at LIMIT ?)",
                    (excess,),
                )
        with self._lock:
            self._conn.execute("PRAGMA incremental_vacuum").fetchall()  # runs per row fetched

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    # -- internals -----------------------------------------------------------------------

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            events, size = self._events, self._bytes
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                self._events, self._bytes = events, size
                raise
            self._conn.execute("COMMIT")

    def _count_stored(self) -> tuple[int, int]:
        totals = self.totals()
        return (
            totals.pending_events + totals.dead_letters,
            totals.pending_bytes + totals.dead_letter_bytes,
        )


def _id_filter(event_ids: Sequence[str] | None) -> tuple[str, tuple[Any, ...]]:
    if event_ids is None:
        return "", ()
    marks = ", ".join("?" for _ in event_ids)
    return f"WHERE event_id IN ({marks})", tuple(event_ids)
