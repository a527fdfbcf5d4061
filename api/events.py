"""POST /v1/events — the ingest endpoint (DESIGN §1)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from anyio import to_thread
from litestar import Request, post
from litestar.datastructures import State

from api.cloudevents_http import decode_events
from api.metrics import record_ingest, record_rejection
from api.openapi_docs import AUTHENTICATED, IngestOperation, keys, problems
from api.services import Services
from api.wire import EventResult, IngestReply
from metering.db import raw_transaction
from metering.errors import MeteringError
from metering.ingest.service import IngestRequest, ingest_events
from metering.keys import Scope


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
    body = await request.body()  # raw bytes: the CloudEvents mode decides how to decode
    return await to_thread.run_sync(_ingest, request, body, state.services)


def _ingest(request: Request[Any, Any, Any], data: bytes, services: Services) -> IngestReply:
    principal = services.authenticate(request, Scope.INGEST)
    try:
        decoded = decode_events(request.headers, data, services.settings.max_batch_events)
        ingest = IngestRequest(
            tenant_id=principal.tenant_id,
            events=decoded.events,
            single=decoded.single,
            received_at=datetime.now(UTC),
        )
        with raw_transaction(services.engine) as conn:
            result = ingest_events(conn, ingest, services.settings, services.catalogs)
    except MeteringError as exc:
        record_rejection(1, exc.code)
        raise
    record_ingest(result.accepted, result.duplicates)
    return IngestReply(
        accepted=result.accepted,
        duplicates=result.duplicates,
        events=[EventResult(o.source, o.id, o.result) for o in result.events],
    )
