"""POST /v1/events — the ingest endpoint (docs/events.md)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from anyio import to_thread
from litestar import Request, post
from litestar.datastructures import State

from api.auth import bearer_key
from api.cloudevents_http import decode_events
from api.ingest_group import GroupCommitter, store_alone
from api.metrics import record_ingest, record_rejection
from api.openapi_docs import AUTHENTICATED, IngestOperation, keys, problems
from api.ratelimit import spend_event_budget
from api.services import Services
from api.wire import EventResult, IngestReply
from metering.errors import MeteringError
from metering.ingest.service import (
    IngestRequest,
    PreparedRequest,
    prepare_request,
    prepare_with_catalog,
)
from metering.ingest.store import IngestResult
from metering.keys import Principal, Scope

# Bodies up to this size are decoded and validated on the event loop (≈ 0.1 ms for one
# event); larger ones, up to a 1 MiB batch, in a worker thread so they hold up no one.
IN_LOOP_MAX_BODY_BYTES = 16 * 1024


@post(
    "/v1/events",
    status_code=200,
    summary="Ingest CloudEvents (structured, binary or batch mode)",
    tags=["ingest"],
    security=keys(Scope.INGEST),
    responses=problems(*AUTHENTICATED, 409, 413, 415, 422),
    operation_class=IngestOperation,
)
async def post_events(request: Request[Any, Any, Any], state: State) -> IngestReply:
    """Durable before the reply: the events are committed when this returns 200."""
    services: Services = state.services
    body = await request.body()  # raw bytes: the CloudEvents mode decides how to decode
    prepared = _prepare_here(request, body, services)
    if prepared is None:
        prepared = await to_thread.run_sync(_prepare, request, body, services)
    await spend_event_budget(
        services.limiter, bearer_key(request), prepared.tenant_id, len(prepared.events)
    )
    try:
        result = await store_request(prepared, services)
    except MeteringError as exc:
        record_rejection(1, exc.code)
        raise
    record_ingest(result.accepted, result.duplicates)
    return IngestReply(
        accepted=result.accepted,
        duplicates=result.duplicates,
        events=[EventResult(o.source, o.id, o.result) for o in result.events],
    )


async def store_request(prepared: PreparedRequest, services: Services) -> IngestResult:
    """Store a prepared request, committed when this returns; raises its refusal (a
    ``MeteringError``) or the database's error. Shared by every ingest endpoint."""
    committer = _committer_for(prepared, services)
    if committer is not None:
        return await committer.store(prepared)
    return await to_thread.run_sync(_store, prepared, services)


def _committer_for(prepared: PreparedRequest, services: Services) -> GroupCommitter | None:
    """Small requests share transactions; a large one amortises its own (config.py)."""
    if len(prepared.events) > services.settings.ingest_group_request_events:
        return None
    return services.ingest_group


def _prepare_here(
    request: Request[Any, Any, Any], data: bytes, services: Services
) -> PreparedRequest | None:
    """Prepare a small request on the event loop when the key and the price catalog are
    cached (the common case, and a thread hop saved); ``None`` when that needs the database
    or the body is large enough to hold up other requests."""
    if len(data) > IN_LOOP_MAX_BODY_BYTES:
        return None
    principal = services.authenticate_cached(request, Scope.INGEST)
    catalog = services.catalogs.fresh()
    if principal is None or catalog is None:
        return None
    with _rejections_recorded():
        ingest = _ingest_request(request, data, services, principal)
        return prepare_with_catalog(ingest, services.settings, catalog)


def _prepare(request: Request[Any, Any, Any], data: bytes, services: Services) -> PreparedRequest:
    principal = services.authenticate(request, Scope.INGEST)
    with _rejections_recorded():
        ingest = _ingest_request(request, data, services, principal)
        return prepare_request(ingest, services.settings, services.catalogs)


def _ingest_request(
    request: Request[Any, Any, Any], data: bytes, services: Services, principal: Principal
) -> IngestRequest:
    decoded = decode_events(request.headers, data, services.settings.max_batch_events)
    return IngestRequest(
        tenant_id=principal.tenant_id,
        events=decoded.events,
        single=decoded.single,
        received_at=datetime.now(UTC),
    )


@contextmanager
def _rejections_recorded() -> Iterator[None]:
    try:
        yield
    except MeteringError as exc:
        record_rejection(1, exc.code)
        raise


def _store(prepared: PreparedRequest, services: Services) -> IngestResult:
    """A large request, alone: the same outcomes as in a group (a refused value is the
    request's ``MeteringError``, counted as a rejection)."""
    outcome = store_alone(services.engine, prepared)
    if isinstance(outcome, Exception):
        raise outcome
    return outcome
