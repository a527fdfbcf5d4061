"""OTLP/JSON bodies → the same protobuf message OTLP/HTTP protobuf bodies decode to.

OTLP/JSON is protobuf's JSON mapping with one exception that matters here: trace and span
ids are hex strings, where the mapping would read ``bytes`` fields as base64 (OTLP
specification, "JSON Protobuf Encoding"). Decoding them as base64 would not fail — it
would silently give other ids, and so other event ids — so the hex ids are rewritten to
base64 before ``json_format`` sees them. Unknown fields are ignored, as the specification
requires of receivers.
"""

from __future__ import annotations

import base64
import json
import re
from typing import Any, Final

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)

from metering.errors import FieldError, bad_request, validation_error

# The hex id fields of a span and of its links, with their byte lengths (0: may be empty).
IdLengths = dict[str, tuple[int, ...]]
SPAN_ID_FIELDS: Final[IdLengths] = {"traceId": (16,), "spanId": (8,), "parentSpanId": (0, 8)}
LINK_ID_FIELDS: Final[IdLengths] = {"traceId": (16,), "spanId": (8,)}
HEX: Final = re.compile(r"(?:[0-9a-fA-F]{2})*")


def decode_otlp_json(body: bytes) -> ExportTraceServiceRequest:
    """An OTLP/JSON ``ExportTraceServiceRequest`` body → the protobuf message.

    Raises :class:`metering.errors.MeteringError`: 400 ``invalid_json`` / ``invalid_otlp``
    for a body that is not one, 422 ``invalid_id`` naming the JSON path of an id that is
    not hex of its length.
    """
    try:
        document = json.loads(body)
    except (ValueError, RecursionError) as error:  # RecursionError: nested too deep
        raise bad_request(f"the body is not JSON: {error}", code="invalid_json") from error
    if not isinstance(document, dict):
        raise bad_request("an OTLP/JSON body is a JSON object", code="invalid_otlp")
    errors: list[FieldError] = []
    for path, span in _spans(document):
        _rewrite_ids(span, path, SPAN_ID_FIELDS, errors)
        links = span.get("links")
        for index, link in enumerate(links if isinstance(links, list) else []):
            if isinstance(link, dict):
                _rewrite_ids(link, f"{path}.links[{index}]", LINK_ID_FIELDS, errors)
    if errors:
        raise validation_error(errors)
    request = ExportTraceServiceRequest()
    try:
        json_format.ParseDict(document, request, ignore_unknown_fields=True)
    except (json_format.ParseError, RecursionError) as error:
        raise bad_request(f"not an OTLP trace export: {error}", code="invalid_otlp") from error
    return request


def _spans(document: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Each span object with its JSON path; either field-name spelling, as protobuf's."""
    found = []
    for r, resource_spans in enumerate(_list(document, "resourceSpans", "resource_spans")):
        for s, scope_spans in enumerate(_list(resource_spans, "scopeSpans", "scope_spans")):
            for i, span in enumerate(_list(scope_spans, "spans", "spans")):
                if isinstance(span, dict):
                    path = f"$.resourceSpans[{r}].scopeSpans[{s}].spans[{i}]"
                    found.append((path, span))
    return found


def _list(parent: Any, camel: str, snake: str) -> list[Any]:
    if not isinstance(parent, dict):
        return []
    value = parent.get(camel, parent.get(snake))
    return value if isinstance(value, list) else []


def _rewrite_ids(
    message: dict[str, Any],
    path: str,
    fields: IdLengths,
    errors: list[FieldError],
) -> None:
    for camel, lengths in fields.items():
        snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in camel)
        for name in (camel, snake):
            if name not in message:
                continue
            value = message[name]
            # fullmatch: bytes.fromhex alone would also take spaces between the digits.
            raw = bytes.fromhex(value) if isinstance(value, str) and HEX.fullmatch(value) else None
            if raw is None or len(raw) not in lengths:
                errors.append(_id_error(f"{path}.{name}", lengths))
                continue
            message[name] = base64.b64encode(raw).decode("ascii")


def _id_error(path: str, lengths: tuple[int, ...]) -> FieldError:
    size = max(lengths)
    return FieldError(path, "invalid_id", f"must be {2 * size} hex digits ({size} bytes)")
