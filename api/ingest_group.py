"""The group committer: concurrent ingest requests of one API process share a transaction.

Each request is validated and priced on its own, then handed to :class:`GroupCommitter`,
which stores it together with the requests that arrived while earlier commits were in
flight (:mod:`metering.ingest.group` says why this keeps every request's guarantees). A lone
request is stored at once: grouping only happens when requests queue up anyway, so it adds
no latency, and the reply still comes after the commit that holds the request's events.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence

import psycopg
import sqlalchemy.exc
from anyio import to_thread
from sqlalchemy.engine import Engine

from metering.db import database_unavailable, raw_transaction
from metering.errors import MeteringError, unstorable_value
from metering.ingest.group import store_together
from metering.ingest.service import PreparedRequest, store_prepared
from metering.ingest.store import STORE_ATTEMPTS, UNSTORABLE_VALUES, IngestResult

# A request's result, its refusal (a ``MeteringError``), or the error it met (the database
# is unavailable): each request gets its own.
Outcome = IngestResult | Exception
Waiting = tuple[PreparedRequest, "asyncio.Future[IngestResult]"]
# ``UNSTORABLE_VALUES`` as the store meets them here, through SQLAlchemy's pool too.
UNSTORABLE = (*UNSTORABLE_VALUES, sqlalchemy.exc.DataError)


def store_group(engine: Engine, requests: Sequence[PreparedRequest]) -> list[Outcome]:
    """Each request's own outcome; one transaction for all when none fails.

    When the shared transaction fails for any reason but an unavailable database, it is
    rolled back and each request is stored again in a transaction of its own, so each gets
    the answer it would have had alone: a refused request (409 conflict, 422 customer
    mismatch), a value the database refuses, a deadlock or a serialization failure never
    reaches the others. An unavailable database is the same for everyone: every request
    gets that error (a 503) at once instead of one connect timeout after another.
    """
    if len(requests) > 1:
        try:
            with raw_transaction(engine) as conn:
                return list(store_together(conn, requests))
        except Exception as exc:
            if database_unavailable(exc):
                return [exc] * len(requests)
    outcomes: list[Outcome] = []
    for request in requests:
        if outcomes and _unavailable(outcomes[-1]):
            outcomes.append(outcomes[-1])  # it went down meanwhile: don't wait for it again
        else:
            outcomes.append(store_alone(engine, request))
    return outcomes


def store_alone(engine: Engine, request: PreparedRequest) -> Outcome:
    """One request in a transaction of its own: its result, or the error it met as a value
    (a ``MeteringError`` when it is the request's fault)."""
    for attempt in range(1, STORE_ATTEMPTS + 1):
        try:
            with raw_transaction(engine) as conn:
                return store_prepared(conn, request)
        except MeteringError as exc:
            return exc
        except UNSTORABLE:
            return unstorable_value()
        except Exception as exc:
            if attempt < STORE_ATTEMPTS and _rolled_back(exc):
                continue
            return exc
    raise AssertionError("unreachable: the last attempt returns")


def _rolled_back(exc: Exception) -> bool:
    """A deadlock or serialization failure: PostgreSQL gave up on the transaction, not on
    its content, and the same transaction may well pass now."""
    cause = exc.orig if isinstance(exc, sqlalchemy.exc.DBAPIError) else exc
    return isinstance(cause, psycopg.errors.TransactionRollback)


def _unavailable(outcome: Outcome) -> bool:
    return isinstance(outcome, Exception) and database_unavailable(outcome)


class GroupCommitter:
    """Stores prepared requests, at most ``max_flushes`` transactions at a time per process.

    Requests that arrive while that many are in flight wait for the next flush, which takes
    them all (up to ``max_events`` events; a larger request goes alone). Lives on one event
    loop; the database work runs in a worker thread.
    """

    def __init__(self, engine: Engine, *, max_events: int, max_flushes: int) -> None:
        self._engine = engine
        self._max_events = max(1, max_events)
        self._max_flushes = max(1, max_flushes)
        self._pending: deque[Waiting] = deque()
        self._flushing = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self.flushes = 0  # transactions started, and the requests they held: for tests
        self.flushed_requests = 0

    async def store(self, request: PreparedRequest) -> IngestResult:
        """The request's result once committed; raises its refusal (a ``MeteringError``)."""
        future: asyncio.Future[IngestResult] = asyncio.get_running_loop().create_future()
        self._pending.append((request, future))
        if self._flushing < self._max_flushes:
            self._start_flush()
        return await future

    def _start_flush(self) -> None:
        group: list[Waiting] = []
        events = 0
        while self._pending:
            request, future = self._pending[0]
            if group and events + len(request.events) > self._max_events:
                break
            self._pending.popleft()
            if not future.done():  # a request whose client went away is not stored
                group.append((request, future))
                events += len(request.events)
        if not group:
            return
        self._flushing += 1
        self.flushes += 1
        self.flushed_requests += len(group)
        task = asyncio.get_running_loop().create_task(self._flush(group))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _flush(
        self, group: list[tuple[PreparedRequest, asyncio.Future[IngestResult]]]
    ) -> None:
        outcomes: Sequence[Outcome | BaseException]
        try:
            outcomes = await to_thread.run_sync(store_group, self._engine, [r for r, _ in group])
        except BaseException as exc:  # the loop is shutting down (store_group returns errors)
            outcomes = [exc] * len(group)
        finally:
            self._flushing -= 1
        for (_, future), outcome in zip(group, outcomes, strict=True):
            _settle(future, outcome)
        if self._pending and self._flushing < self._max_flushes:
            self._start_flush()


def _settle(future: asyncio.Future[IngestResult], outcome: Outcome | BaseException) -> None:
    if future.done():
        return
    if isinstance(outcome, asyncio.CancelledError):
        future.cancel()
    elif isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
