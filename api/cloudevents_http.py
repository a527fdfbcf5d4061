"""The CloudEvents 1.0 HTTP binding: structured, binary and batch modes → plain dicts.

Transport only: this turns a request into decoded event dicts; what an event means is
``metering.ingest``'s business.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import msgspec

from metering.errors import bad_request, payload_too_large, unsupported_media_type

STRUCTURED = "application/cloudevents+json"
BATCH = "application/cloudevents-batch+json"


@dataclass(frozen=True, slots=True)
class DecodedRequest:
    events: list[Any]
    single: bool
    mode: str  # "structured" | "binary" | "batch"


def decode_json(body: bytes) -> Any:
    if not body:
        raise bad_request("the request body is empty", code="empty_body")
    try:
        return msgspec.json.decode(body)
    except RecursionError:
        raise bad_request("the JSON is nested too deeply", code="json_too_deep") from None
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise bad_request(f"the body is not valid JSON: {exc}", code="malformed_json") from None


def media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def decode_events(headers: Mapping[str, str], body: bytes, max_events: int) -> DecodedRequest:
    """Decode a request in any of the three modes; 415 for anything else."""
    kind = media_type(headers.get("content-type", ""))
    if kind == STRUCTURED:
        return DecodedRequest([decode_json(body)], single=True, mode="structured")
    if kind == BATCH:
        events = decode_json(body)
        if not isinstance(events, list):
            raise bad_request("a batch must be a JSON array of events", code="batch_not_array")
        if not events:
            raise bad_request("the batch is empty", code="empty_batch")
        if len(events) > max_events:
            raise payload_too_large(f"a batch holds at most {max_events} events")
        return DecodedRequest(events, single=False, mode="batch")
    if "ce-specversion" in headers:
        return DecodedRequest([_binary_event(headers, body, kind)], single=True, mode="binary")
    raise unsupported_media_type(
        f"send {STRUCTURED}, {BATCH}, or binary mode (ce-* headers with a JSON body)"
    )


def _binary_event(headers: Mapping[str, str], body: bytes, kind: str) -> dict[str, Any]:
    event: dict[str, Any] = {
        name[3:].lower(): unquote(value)
        for name, value in headers.items()
        if name.lower().startswith("ce-")
    }
    if kind:
        event["datacontenttype"] = headers.get("content-type", "")
    if kind and not (kind == "application/json" or kind.endswith("+json")):
        raise unsupported_media_type(
            "binary-mode data must be JSON (content-type application/json)"
        )
    event["data"] = decode_json(body)
    return event
