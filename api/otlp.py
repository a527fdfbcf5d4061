"""POST /v1/traces — OTLP/HTTP trace export: GenAI spans metered (issue #19, docs/otlp.md).

The wire is the OTLP/HTTP specification's (opentelemetry.io/docs/specs/otlp/, "OTLP/HTTP"):
binary protobuf or JSON, optionally gzip-compressed; the reply is an
``ExportTraceServiceResponse`` in the request's encoding, whose ``partial_success`` counts
the spans refused and says why. Status codes are chosen for what exporters do with them:
4xx is never retried (a body that cannot be decoded will not decode the next time), 429
and 503 are retried after ``Retry-After`` — so a database outage is a 503, never a 500.
"""

from __future__ import annotations

import uuid
import zlib
from datetime import UTC, datetime
from functools import partial
from typing import Any, Final

from anyio import to_thread
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from litestar import Request, Response, post
from litestar.datastructures import State
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from api.auth import bearer_key
from api.cloudevents_http import media_type
from api.cpu_pool import cpu_pool
from api.heavy import Heavy, heavy_request
from api.ingest import store_request
from api.metrics import record_ingest, record_rejection, record_spans
from api.openapi_docs import TracesOperation, keys
from api.otlp_errors import JSON, OTLP_EXCEPTION_HANDLERS, PROTOBUF, TRACES_PATH
from api.otlp_work import (
    EXPORT_APPLICATION,
    ExportJob,
    StoredExport,
    check_export,
    store_export,
)
from api.ratelimit import spend_event_budget
from api.services import Services
from metering.config import Settings
from metering.db import QueryGuard, terminate_backends
from metering.errors import (
    MeteringError,
    bad_request,
    payload_too_large,
    unsupported_media_type,
)
from metering.ingest.service import PreparedRequest, time_window
from metering.ingest.spans import (
    PreparedSpans,
    by_run,
    partial_success_message,
    price_spans,
    refused_reasons,
    run_refused_reasons,
)
from metering.keys import Principal, Scope
from metering.otlp import MappedSpans
from metering.otlp.export import check_span_total, json_span_count, span_count

# A gzip body may inflate to this many times the request body limit, and no further: a few
# kilobytes of zeros must not become gigabytes in memory. Spans compress about tenfold.
MAX_INFLATION: Final = 16


@post(
    TRACES_PATH,
    status_code=200,
    summary="Ingest OpenTelemetry GenAI spans (OTLP/HTTP, protobuf or JSON)",
    tags=["ingest"],
    security=keys(Scope.INGEST),
    exception_handlers=OTLP_EXCEPTION_HANDLERS,
    operation_class=TracesOperation,
)
async def post_traces(request: Request[Any, Any, Any], state: State) -> Response[bytes]:
    """Durable before the reply: the accepted spans' events are committed when this returns.

    An export runs in one of its tenant's slots (``otlp_concurrent_exports_per_tenant``,
    429 beyond) and is cancelled in PostgreSQL when its exporter disconnects or
    ``otlp_export_timeout_s`` has passed (api/heavy.py). A large one (more spans than
    ``ingest_group_request_events``) is checked, priced and stored by a worker process
    (api/otlp_work.py), and spends its tenant's events budget by its spans, before any of
    that work: the API process only inflates and counts it."""
    services: Services = state.services
    settings = services.settings
    encoding = media_type(request.headers.get("content-type", ""))
    body = await request.body()
    # first: 401 before 415, and before a slot is taken
    principal = await to_thread.run_sync(services.authenticate, request, Scope.INGEST)
    heavy = Heavy.otlp_export(settings)
    async with heavy_request(request, services, heavy, principal.tenant_id) as guard:
        received_at = datetime.now(UTC)
        inflated, spans = await to_thread.run_sync(_sized, request, body, encoding, settings)
        if spans is not None:  # large: spent by its spans, all its work in a worker
            await spend_event_budget(
                services.limiter, bearer_key(request), principal.tenant_id, spans
            )
            job = _job(inflated, encoding, principal, received_at, settings, heavy)
            stored = await to_thread.run_sync(_store_in_worker, job, settings, guard)
            return _stored_reply(encoding, stored)
        prepared, reasons = await to_thread.run_sync(
            _prepare, principal, inflated, encoding, received_at, services
        )
        events = len(prepared.request.events)
        await spend_event_budget(services.limiter, bearer_key(request), principal.tenant_id, events)
        refused_at_store = await _store(prepared.request, services) if events else []
    record_spans("accepted", "", events - len(refused_at_store))  # stored, or stored before
    record_spans("rejected", "refused_by_ingest", len(prepared.refused) + len(refused_at_store))
    return _reply(encoding, [*reasons, *prepared.refused, *refused_at_store])


def _sized(
    request: Request[Any, Any, Any], body: bytes, encoding: str, settings: Settings
) -> tuple[bytes, int | None]:
    """The body inflated, and its span count when it is large (``None``: small, or not an
    export, which ``_prepare`` refuses); 415, 400 and 413 before any other work."""
    try:
        if encoding not in (PROTOBUF, JSON):
            raise unsupported_media_type(f"send OTLP/HTTP as {PROTOBUF} or {JSON}")
        inflated = _inflated(request, body, settings.max_body_bytes)
        spans = _large_export_spans(inflated, encoding, settings.ingest_group_request_events)
        if spans is not None:
            check_span_total(spans, settings.otlp_max_spans_per_request)
    except MeteringError as exc:
        record_rejection(1, exc.code)
        raise
    return inflated, spans


def _job(
    inflated: bytes,
    encoding: str,
    principal: Principal,
    received_at: datetime,
    settings: Settings,
    heavy: Heavy,
) -> ExportJob:
    return ExportJob(
        inflated,
        as_json=encoding == JSON,
        max_spans=settings.otlp_max_spans_per_request,
        window=time_window(settings, received_at),
        tenant_id=principal.tenant_id,
        received_at=received_at,
        conninfo=settings.libpq_url(),
        tag=uuid.uuid4().hex[:16],
        options=heavy.limits.options(),
    )


def _store_in_worker(job: ExportJob, settings: Settings, guard: QueryGuard) -> StoredExport:
    """``store_export`` in a worker; cancelled with ``guard``, its backend terminated."""
    stop = partial(terminate_backends, job.conninfo, f"{EXPORT_APPLICATION}{job.tag}-")
    try:
        stored = cpu_pool(settings).run(guard, store_export, job, on_cancel=stop)
    except MeteringError as exc:
        record_rejection(1, exc.code)
        raise
    _record_mapped(stored.mapped)
    record_ingest(stored.accepted, stored.duplicates)
    for events, code in stored.rejections:
        record_rejection(events, code)
    return stored


def _stored_reply(encoding: str, stored: StoredExport) -> Response[bytes]:
    refused = [*stored.refused, *stored.refused_at_store]
    record_spans("accepted", "", stored.accepted + stored.duplicates)
    record_spans("rejected", "refused_by_ingest", len(refused))
    rejected = [span.describe() for span in stored.mapped.rejected]
    return _reply(encoding, [*rejected, *refused])


def _prepare(
    principal: Principal,
    inflated: bytes,
    encoding: str,
    received_at: datetime,
    services: Services,
) -> tuple[PreparedSpans, list[str]]:
    """A small export checked and priced here: cheap, and its events share a group commit."""
    settings = services.settings
    try:
        checked = check_export(
            inflated,
            as_json=encoding == JSON,
            max_spans=settings.otlp_max_spans_per_request,
            window=time_window(settings, received_at),
        )
    except MeteringError as exc:
        record_rejection(1, exc.code)
        raise
    _record_mapped(checked.mapped)
    prepared = price_spans(checked.spans, principal.tenant_id, received_at, services.catalogs)
    return prepared, [rejected.describe() for rejected in checked.mapped.rejected]


def _record_mapped(mapped: MappedSpans) -> None:
    record_spans("ignored", "non_genai", mapped.ignored_non_genai_spans)
    record_spans("ignored", "without_usage", mapped.ignored_without_usage_spans)
    record_spans("ignored", "nested_agent", mapped.ignored_nested_agent_spans)
    record_spans("duplicate", "in_request", mapped.duplicate_spans)
    record_spans("rejected", "unmappable", len(mapped.rejected))


def _large_export_spans(inflated: bytes, encoding: str, spans: int) -> int | None:
    """How many spans an export holds when it holds more than ``spans`` (``None`` when it
    holds no more, or is not an export), found without Python work per span: a protobuf
    body is parsed in C (~2 ms for 2,048 spans) and its spans counted; an OTLP/JSON one has
    at least one ``{`` a span (each is an object), and one with more is parsed as JSON (C,
    ~15 µs a span) and its span lists counted."""
    if encoding == JSON:
        if inflated.count(b"{") <= spans:
            return None
        counted = json_span_count(inflated) or 0
    else:
        export = ExportTraceServiceRequest()
        try:
            export.ParseFromString(inflated)
        except (DecodeError, RecursionError):
            return None
        counted = span_count(export)
    return counted if counted > spans else None


def _inflated(request: Request[Any, Any, Any], body: bytes, max_body_bytes: int) -> bytes:
    """The body inflated: every member of a gzip body (RFC 1952 §2.2: a gzip file is a
    series of members; reading only the first dropped the rest's spans unbilled), all
    members together at most ``MAX_INFLATION`` × the body limit; bytes after a member that
    are not a member themselves are a 400."""
    coding = request.headers.get("content-encoding", "identity").strip().lower()
    if coding in ("", "identity"):
        return body
    if coding != "gzip":
        raise unsupported_media_type(f"Content-Encoding {coding!r}: send gzip or none")
    limit = max_body_bytes * MAX_INFLATION
    inflated = bytearray()
    compressed = memoryview(body)
    position = _inflate_member(compressed, 0, inflated, limit)
    while position < len(compressed):
        position = _inflate_member(compressed, position, inflated, limit)
    return bytes(inflated)


def _inflate_member(compressed: memoryview, start: int, inflated: bytearray, limit: int) -> int:
    """Inflate the member at ``start`` onto ``inflated``; where the next one starts. The input
    goes in doubling slices: zlib copies what follows a member's end (``unused_data``), and a
    body of many tiny members must not copy the whole rest of the body once per member."""
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # gzip framing, one member
    position, step = start, 64
    while not inflater.eof:
        if position == len(compressed):
            raise bad_request("the gzip body is truncated", code="invalid_gzip")
        piece = compressed[position : position + step]
        position, step = position + len(piece), min(step * 2, 64 * 1024)
        try:
            inflated += inflater.decompress(piece, limit - len(inflated) + 1)
        except zlib.error as error:
            what = (
                f"the bytes at offset {start} are not a gzip member"
                if start
                else "the body is not gzip"
            )
            raise bad_request(f"{what}: {error}", code="invalid_gzip") from error
        if len(inflated) > limit or inflater.unconsumed_tail:
            raise payload_too_large(f"a gzip body inflates to at most {limit} bytes")
    return position - len(inflater.unused_data)


async def _store(prepared: PreparedRequest, services: Services) -> list[str]:
    """Store a small export's events as ``POST /v1/events`` stores a request (group commit
    included); reasons for the spans of the runs the store refused.

    When the store refuses the export as a whole (an event id already stored with other
    content: a conflict; a run owned by another customer), each run is stored on its own so
    that only the runs at fault are refused (as ``store_export`` does for a large one). An
    unavailable database raises (503).
    """
    try:
        result = await store_request(prepared, services)
        record_ingest(result.accepted, result.duplicates)
        return refused_reasons(result)
    except MeteringError:
        pass
    reasons: list[str] = []
    for run in by_run(prepared):
        try:
            result = await store_request(run, services)
            record_ingest(result.accepted, result.duplicates)
            reasons.extend(refused_reasons(result))
        except MeteringError as refusal:
            record_rejection(len(run.events), refusal.code)
            reasons.extend(run_refused_reasons(run, refusal))
    return reasons


def _reply(encoding: str, reasons: list[str]) -> Response[bytes]:
    """The ``ExportTraceServiceResponse``: ``partial_success`` only when spans were rejected
    (the specification: a receiver that accepted everything leaves it unset)."""
    reply = ExportTraceServiceResponse()
    if reasons:
        reply.partial_success.rejected_spans = len(reasons)
        reply.partial_success.error_message = partial_success_message(reasons)
    if encoding == JSON:
        content = json_format.MessageToJson(reply, indent=None).encode()
    else:
        content = reply.SerializeToString()
    return Response(content, status_code=200, media_type=encoding)
