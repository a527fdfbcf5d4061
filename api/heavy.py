"""Heavy requests (what-ifs, OTLP exports) at the HTTP edge: a tenant's share, and no work
for a client that is gone.

Each runs in one of its tenant's slots (api/tenant_slots.py: a 429 when the tenant already
runs its share), with its statements bounded in PostgreSQL (metering/db.py:
``bounded_transaction``), and is cancelled in PostgreSQL when its client disconnects or its
time is up: the ASGI server reports a closed socket as ``http.disconnect`` on ``receive``
once the body has been read, and a watcher waiting for it cancels the request's queries
(``QueryGuard``) until the work gives up. A statement cancelled or a lock not granted in
time answers a retryable 503, never a 500.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, TypeVar

import anyio
import psycopg
from anyio import to_thread
from litestar import Request
from litestar.types import Receive

from api.services import Services
from api.tenant_slots import SlotKind, tenant_slot
from metering.config import Settings
from metering.db import QueryGuard, StatementLimits, bounded_transaction, timed_out
from metering.errors import MeteringError
from metering.policies.defaults import settings_policy
from metering.settlement.replay import WhatIf
from metering.settlement.replay_shards import Parallelism
from metering.settlement.whatif import what_if

T = TypeVar("T")

# A use case between statements (replaying in Python) misses a cancel request: it is sent
# again this often until the work has given up.
CANCEL_REPEAT_S: Final = 0.2
# A slot's lease outlives the request it guards by this much (the reply is still being
# rendered and sent when the database work ends); a crashed process leaks it this long.
LEASE_MARGIN_S: Final = 30.0


@dataclass(frozen=True)
class Heavy:
    """A kind of heavy request: its slots, and its limits in PostgreSQL (``timeout_s`` is
    also how long the whole request may run there)."""

    slots: SlotKind
    limits: StatementLimits
    noun: str

    @classmethod
    def what_if(cls, settings: Settings) -> Heavy:
        return cls._of(
            settings,
            "whatif",
            settings.whatif_concurrent_per_tenant,
            settings.whatif_timeout_s,
            ("too_many_concurrent_whatifs", "what-if"),
        )

    @classmethod
    def otlp_export(cls, settings: Settings) -> Heavy:
        return cls._of(
            settings,
            "otlp",
            settings.otlp_concurrent_exports_per_tenant,
            settings.otlp_export_timeout_s,
            ("too_many_concurrent_exports", "OTLP export"),
        )

    @classmethod
    def _of(
        cls,
        settings: Settings,
        name: str,
        per_tenant: int,
        timeout_s: float,
        words: tuple[str, str],
    ) -> Heavy:
        code, noun = words
        lease_s = timeout_s + LEASE_MARGIN_S
        prefix = settings.heavy_slots_redis_prefix
        slots = SlotKind(name, prefix, per_tenant, lease_s, code, f"{noun}s")
        return cls(slots, StatementLimits(timeout_s, settings.heavy_lock_timeout_s), noun)


@asynccontextmanager
async def heavy_request(
    request: Request[Any, Any, Any], services: Services, heavy: Heavy, tenant: str
) -> AsyncIterator[QueryGuard]:
    """One of ``tenant``'s slots of ``heavy`` (429 when none is free) while the block runs,
    and the guard through which its queries are cancelled in PostgreSQL when the client
    disconnects or ``heavy``'s time is up; a timeout raised in the block becomes a 503."""
    async with tenant_slot(services.redis_async, heavy.slots, tenant):
        guard = QueryGuard()
        failure: Exception | None = None
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(_cancel_when_gone, request.receive, guard, heavy.limits)
            try:
                yield guard
            except Exception as exc:  # raised below, outside the task group (no group)
                failure = exc
            tasks.cancel_scope.cancel()
    if failure is not None:
        if timed_out(failure):
            raise _timed_out(heavy, failure) from failure
        raise failure


async def run_heavy(
    request: Request[Any, Any, Any],
    services: Services,
    heavy: Heavy,
    tenant: str,
    work: Callable[[QueryGuard], T],
) -> T:
    """``work`` on a worker thread, as :func:`heavy_request` says."""
    async with heavy_request(request, services, heavy, tenant) as guard:
        return await to_thread.run_sync(work, guard)


async def run_what_if(
    request: Request[Any, Any, Any],
    services: Services,
    tenant: str,
    what: tuple[str, object],
    render: Callable[[WhatIf], T],
) -> T:
    """The what-if of ``what`` (a period, a candidate document) over ``tenant``'s runs, as
    the API and the console both run it: a heavy request (:func:`run_heavy`), replayed by
    the workers the process's tenants share (``Parallelism.of``); ``render`` makes the
    reply of the report on the worker thread (a CSV of many customers is not made on the
    event loop)."""
    settings = services.settings
    heavy = Heavy.what_if(settings)
    period, document = what

    def work(guard: QueryGuard) -> T:
        with bounded_transaction(services.engine, heavy.limits, guard) as conn:
            report = what_if(
                conn,
                tenant,
                period,
                document,
                settings_policy(settings),
                datetime.now(UTC),
                Parallelism.of(settings),
                cancelled=lambda: guard.cancelled,
            )
        return render(report)

    return await run_heavy(request, services, heavy, tenant, work)


async def _cancel_when_gone(receive: Receive, guard: QueryGuard, limits: StatementLimits) -> None:
    with anyio.move_on_after(limits.statement_timeout_s):
        while (await receive())["type"] != "http.disconnect":
            pass  # the body was read before the handler ran: nothing else should come
    while True:
        await to_thread.run_sync(guard.cancel)
        await anyio.sleep(CANCEL_REPEAT_S)


def _timed_out(heavy: Heavy, exc: Exception) -> MeteringError:
    """503 with ``Retry-After``: the request ran out of its time, not out of luck for good."""
    limits = heavy.limits
    cause = getattr(exc, "orig", None) or exc
    if isinstance(cause, psycopg.errors.LockNotAvailable):
        detail = (
            f"the {heavy.noun} waited longer than {limits.lock_timeout_s:g} s for a lock "
            "(another request was writing the same run); retry"
        )
        return _unavailable(detail, "lock_timeout", retry_after_s=1)
    detail = (
        f"the {heavy.noun} ran longer than {limits.statement_timeout_s:g} s in the database "
        "and was cancelled; retry later"
    )
    return _unavailable(detail, "statement_timeout", retry_after_s=5)


def _unavailable(detail: str, code: str, *, retry_after_s: int) -> MeteringError:
    return MeteringError(
        detail,
        code=code,
        status=503,
        title="Service unavailable",
        extra={"retry_after_s": retry_after_s},
    )
