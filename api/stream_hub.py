"""One LISTEN connection per API process, fanning committed notifications out to the live
status streams open on that process.

``record`` (metering/notifications) sends ``pg_notify`` with ``[id, tenant, customer,
subject]``; PostgreSQL delivers it on commit to every listening connection, whichever
process or worker committed. Here one connection listens (started with the first stream),
the ids some open stream wants are read back in one query, and each row goes to the inbox of
every stream that shows it, keyed by tenant and customer.

Memory is bounded and nothing is lost: an inbox holds at most ``stream_queue_items`` rows;
a stream whose inbox overflows, and every stream when the listening connection was lost
(notifications committed meanwhile were never heard), is marked *behind* and catches up
from the notifications table after the last id it sent.

Slots are shared fairly: a process serves at most ``stream_max_per_process`` streams, a
tenant at most ``stream_max_per_tenant`` of them and a key at most ``stream_max_per_key``,
so one tenant's streams, however many keys open them, leave room for the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections import deque
from typing import Any

import psycopg
from anyio import to_thread
from sqlalchemy.engine import Engine

from api.metrics import STREAM_LISTENER_RECONNECTS, STREAMS_OPEN
from metering.config import Settings
from metering.db import raw_transaction
from metering.errors import MeteringError
from metering.notifications import CHANNEL
from metering.notifications.replay import StoredNotification, StreamScope, by_ids

log = logging.getLogger("fairmeter.streams")

# How the listening connection names itself in pg_stat_activity, with the process id:
# operators (and the tests that cut it) find each process's one listener by it.
APPLICATION_NAME = "fairmeter-stream-listener"
MAX_RETRY_S = 30.0
# Announced ids waiting to be read back; beyond this the fan-out gives up on them and every
# stream catches up from the table instead.
MAX_PENDING = 10_000
# What a refused stream is told to wait: about the time it takes one of the holder's (or the
# process's) streams to end, by the client's leaving or by ``stream_max_s``.
RETRY_AFTER_S = 5

Key = tuple[str, str]  # (tenant, customer)


class Inbox:
    """One open stream's share of the fan-out: rows to send, or word that it is behind."""

    def __init__(self, scope: StreamScope, holder: str, max_items: int) -> None:
        self.scope = scope
        self.holder = holder  # the key id that opened it
        self._rows: deque[StoredNotification] = deque()
        self._max_items = max_items
        self._behind = False
        self._wake = asyncio.Event()

    def offer(self, row: StoredNotification) -> None:
        if len(self._rows) >= self._max_items:
            self.fall_behind()  # a slow client: forget the rows, read them later
            return
        self._rows.append(row)
        self._wake.set()

    def fall_behind(self) -> None:
        self._rows.clear()
        self._behind = True
        self._wake.set()

    async def wait(self, timeout_s: float) -> bool:
        """Whether there is something to take before ``timeout_s`` passes."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout_s)
        return self._wake.is_set()

    def take(self) -> tuple[list[StoredNotification], bool]:
        """The rows offered so far and whether the stream must catch up from the table."""
        rows, behind = list(self._rows), self._behind
        self._rows.clear()
        self._behind = False
        self._wake.clear()
        return rows, behind

    def wants(self, subject: str | None) -> bool:
        """Whether an announcement about run ``subject`` (of this inbox's customer) may be
        for this stream: a customer's stream wants all of them, a run's stream its own."""
        return self.scope.run_id is None or subject == self.scope.subject


def _too_many(
    status: int, detail: str, code: str = "too_many_streams", **extra: int
) -> MeteringError:
    return MeteringError(
        detail,
        code=code,
        status=status,
        title="Too many requests" if status == 429 else "Service unavailable",
        extra={"retry_after_s": RETRY_AFTER_S, **extra},
    )


class StreamHub:
    """The process's listener and the inboxes of its open streams. Lives on one event loop."""

    def __init__(self, settings: Settings, engine: Engine) -> None:
        self._conninfo = settings.sqlalchemy_url().replace("postgresql+psycopg://", "postgresql://")
        self._engine = engine
        self._max_streams = settings.stream_max_per_process
        self._max_per_key = settings.stream_max_per_key
        self._max_per_tenant = settings.stream_max_per_tenant
        self._max_items = settings.stream_queue_items
        self._retry_s = settings.stream_listener_retry_s
        self._check_s = settings.stream_listener_check_s
        self._inboxes: dict[Key, set[Inbox]] = {}
        self._pending: list[tuple[int, Key]] = []
        self._pending_ready: asyncio.Event | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._held: dict[str, int] = {}  # open streams by the key id that opened them
        self._by_tenant: dict[str, int] = {}  # open streams by tenant
        self.open = 0

    def subscribe(self, scope: StreamScope, holder: str) -> Inbox:
        """An inbox for a new stream of ``scope``'s tenant opened by key ``holder``. Refused
        (see :meth:`_admit`) when the key or the tenant holds its share, or the process is
        full. The caller must :meth:`unsubscribe` it when the stream ends, however it ends."""
        self._admit(scope.tenant_id, holder)
        self._start()
        inbox = Inbox(scope, holder, self._max_items)
        self._inboxes.setdefault((scope.tenant_id, scope.customer_id), set()).add(inbox)
        self._held[holder] = self._held.get(holder, 0) + 1
        self._by_tenant[scope.tenant_id] = self._by_tenant.get(scope.tenant_id, 0) + 1
        self.open += 1
        STREAMS_OPEN.inc()
        return inbox

    def _admit(self, tenant: str, holder: str) -> None:
        """The narrowest share that is full answers, so the reply blames whoever holds the
        slots: 429 ``too_many_streams`` for the key, 429 ``too_many_streams_for_tenant`` for
        the tenant (whatever the process's state: a tenant over its share is never told the
        server is full), and only then 503 ``too_many_streams`` for a process full of
        streams of tenants each within its share (another process may have room)."""
        if self._held.get(holder, 0) >= self._max_per_key:
            raise _too_many(
                429,
                f"this key holds {self._max_per_key} open streams on this API process "
                "(FAIRMETER_STREAM_MAX_PER_KEY); close one first",
                limit=self._max_per_key,
            )
        if self._by_tenant.get(tenant, 0) >= self._max_per_tenant:
            raise _too_many(
                429,
                f"this tenant holds {self._max_per_tenant} open streams on this API process, "
                "its share (FAIRMETER_STREAM_MAX_PER_TENANT); close one first",
                "too_many_streams_for_tenant",
                limit=self._max_per_tenant,
            )
        if self.open >= self._max_streams:
            raise _too_many(
                503,
                f"this API process serves {self._max_streams} streams already; retry, "
                "another process may have room",
                limit=self._max_streams,
            )

    def unsubscribe(self, inbox: Inbox) -> None:
        key = (inbox.scope.tenant_id, inbox.scope.customer_id)
        inboxes = self._inboxes.get(key)
        if inboxes is None or inbox not in inboxes:
            return
        inboxes.discard(inbox)
        if not inboxes:
            del self._inboxes[key]
        self._held[inbox.holder] -= 1
        if not self._held[inbox.holder]:
            del self._held[inbox.holder]
        tenant = inbox.scope.tenant_id
        self._by_tenant[tenant] -= 1
        if not self._by_tenant[tenant]:
            del self._by_tenant[tenant]
        self.open -= 1
        STREAMS_OPEN.dec()

    def held_by(self, holder: str) -> int:
        """Open streams of key ``holder`` on this process."""
        return self._held.get(holder, 0)

    def held_by_tenant(self, tenant: str) -> int:
        """Open streams of ``tenant`` on this process, whichever keys opened them."""
        return self._by_tenant.get(tenant, 0)

    def _start(self) -> None:
        """The listener and the reader start with the first stream (not at import or in
        processes that never serve one)."""
        if self._tasks and not any(t.done() for t in self._tasks):
            return
        for task in self._tasks:
            task.cancel()
        self._pending_ready = asyncio.Event()
        self._tasks = [
            asyncio.create_task(self._listen(), name="stream-listener"),
            asyncio.create_task(self._read_back(), name="stream-reader"),
        ]

    def _everyone_behind(self) -> None:
        self._pending.clear()
        for inboxes in self._inboxes.values():
            for inbox in inboxes:
                inbox.fall_behind()

    async def _listen(self) -> None:
        """LISTEN, forever: after every (re)connection each stream catches up from the table,
        since what committed while nobody listened was announced to no one."""
        delay = self._retry_s
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self._conninfo,
                    autocommit=True,
                    application_name=f"{APPLICATION_NAME} {os.getpid()}",
                    connect_timeout=5,
                ) as conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    delay = self._retry_s
                    self._everyone_behind()
                    await self._hear(conn)
            except Exception as exc:  # lost, refused, or anything else: listen again
                STREAM_LISTENER_RECONNECTS.inc()
                log.warning(
                    "stream listener lost its connection (%r); reconnecting in %.1fs", exc, delay
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_RETRY_S)

    async def _hear(self, conn: psycopg.AsyncConnection[Any]) -> None:
        while True:
            async for notify in conn.notifies(timeout=self._check_s):
                self._announced(notify.payload)
            await conn.execute("SELECT 1")  # a quiet connection may be a dead one

    def _announced(self, payload: str) -> None:
        try:
            nid, tenant, customer, subject = json.loads(payload)
            key = (str(tenant), str(customer))
            nid = int(nid)
        except (ValueError, TypeError):
            log.warning("ignoring a malformed notification announcement")
            return
        inboxes = self._inboxes.get(key)
        if not inboxes or not any(inbox.wants(subject) for inbox in inboxes):
            return  # nobody here follows it: not even read back
        if len(self._pending) >= MAX_PENDING:
            self._everyone_behind()
            return
        self._pending.append((nid, key))
        assert self._pending_ready is not None
        self._pending_ready.set()

    async def _read_back(self) -> None:
        """Read the announced rows back, many ids per query, and hand them out."""
        assert self._pending_ready is not None
        while True:
            await self._pending_ready.wait()
            self._pending_ready.clear()
            batch, self._pending = self._pending, []
            if not batch:
                continue
            try:
                rows = await to_thread.run_sync(self._fetch, [nid for nid, _ in batch])
            except Exception as exc:  # the database hiccupped: those streams read it later
                log.warning("stream fan-out could not read notifications: %r", exc)
                for key in {key for _, key in batch}:
                    for inbox in self._inboxes.get(key, ()):
                        inbox.fall_behind()
                continue
            for row in rows:
                for inbox in self._inboxes.get((row.tenant_id, row.customer_id), ()):
                    if row.within(inbox.scope):
                        inbox.offer(row)

    def _fetch(self, ids: list[int]) -> list[StoredNotification]:
        with raw_transaction(self._engine) as conn:
            return by_ids(conn, ids)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
