"""An OTLP/HTTP export's body → the ``ExportTraceServiceRequest`` it holds, bounded.

The rules for what a body must be (an export of at most so many spans) in one place, for
the API process and for the worker processes that decode large exports (api/otlp_work.py).
"""

from __future__ import annotations

import json
from typing import Any

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from metering.errors import bad_request, payload_too_large
from metering.otlp.json_encoding import decode_otlp_json


def decode_export(body: bytes, *, as_json: bool) -> ExportTraceServiceRequest:
    """The ``ExportTraceServiceRequest`` of an OTLP/JSON or binary protobuf body; 400 when
    it is not one."""
    if as_json:
        return decode_otlp_json(body)
    export = ExportTraceServiceRequest()
    try:
        export.ParseFromString(body)
    except (DecodeError, RecursionError) as error:
        raise bad_request(
            f"not an OTLP protobuf trace export: {error}", code="invalid_otlp"
        ) from None
    return export


def span_count(export: ExportTraceServiceRequest) -> int:
    """Every span of the export, GenAI or not."""
    return sum(len(s.spans) for r in export.resource_spans for s in r.scope_spans)


def json_span_count(body: bytes) -> int | None:
    """The spans of an OTLP/JSON body counted on its parsed JSON (C), without the Python
    work per span of decoding it (~0.3 ms a span); ``None`` when it is not a JSON object.
    Either field-name spelling, as protobuf's JSON mapping takes."""
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(document, dict):
        return None
    return sum(
        len(_list(scope_spans, "spans", "spans"))
        for resource_spans in _list(document, "resourceSpans", "resource_spans")
        for scope_spans in _list(resource_spans, "scopeSpans", "scope_spans")
    )


def _list(parent: Any, camel: str, snake: str) -> list[Any]:
    if not isinstance(parent, dict):
        return []
    value = parent.get(camel, parent.get(snake))
    return value if isinstance(value, list) else []


def check_span_count(export: ExportTraceServiceRequest, max_spans: int) -> None:
    """413 for an export of more than ``max_spans`` spans, all of them counted (GenAI or
    not): one export is one transaction holding its runs' locks, and a bounded one keeps
    that short. Exporters split a batch that is too large into several requests."""
    check_span_total(span_count(export), max_spans)


def check_span_total(spans: int, max_spans: int) -> None:
    """``check_span_count`` for an export whose spans were counted already."""
    if spans > max_spans:
        raise payload_too_large(
            f"an export holds at most {max_spans} spans, this one {spans}: "
            f"export smaller batches (e.g. OTEL_BSP_MAX_EXPORT_BATCH_SIZE, 512 by default)"
        )
