"""The CloudEvents 1.0 HTTP binding: structured, binary and batch modes → plain dicts.

Transport only: this turns a request into decoded event dicts; what an event means is
``metering.ingest``'s business.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import msgspec

from metering.errors import bad_request, payload_too_large, unsupported_media_type

STRUCTURED = "application/cloudevents+json"
BATCH = "application/cloudevents-batch+json"
# A '%' that does not start a percent-encoded byte: the sender did not encode a '%'.
STRAY_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")

_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()


@dataclass(frozen=True, slots=True)
class DecodedRequest:
    events: list[Any]
    single: bool
    mode: str  # "structured" | "binary" | "batch"


def decode_json(body: bytes) -> Any:
    if not body:
        raise bad_request("the request body is empty", code="empty_body")
    try:
        value = _decoder.decode(body)
    except RecursionError:
        raise bad_request("the JSON is nested too deeply", code="json_too_deep") from None
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise bad_request(f"the body is not valid JSON: {exc}", code="malformed_json") from None
    if _may_hold_duplicate_keys(body, value):
        duplicate = _first_duplicate_key(body)
        if duplicate is not None:
            raise bad_request(
                f"a JSON object holds the key {json.dumps(duplicate)} more than once",
                code="duplicate_key",
            )
    return value


def _may_hold_duplicate_keys(body: bytes, value: Any) -> bool:
    """False when no object of ``body`` (valid JSON, decoded to ``value``) repeats a key.

    A decoder keeps one value per key (msgspec the last), so ``{"input_tokens": 1000,
    "input_tokens": 1}`` would be billed as 1 token without a word. The exact check costs
    about four times the decoding; this count costs a fraction of it. In valid JSON each
    ':' byte either separates a key from its value or sits in a string, so ``body`` and
    ``value`` re-encoded hold the same number of them, unless ``value`` lost a repeated key
    (and its value: fewer ':') or a string in ``body`` wrote one as ``\\u003a`` (then the
    count proves nothing, and this says True). tests/unit/test_duplicate_keys.py holds it
    to the exact check.
    """
    if b"\\u003" in body:
        return True
    return body.count(b":") != _encoder.encode(value).count(b":")


class _DuplicateKey(Exception):
    pass


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) < len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return found


def _first_duplicate_key(body: bytes) -> str | None:
    """The first key some object of ``body`` repeats (the exact, slower check)."""
    try:
        json.loads(body, object_pairs_hook=_unique_pairs)
    except _DuplicateKey as exc:
        return str(exc.args[0])
    return None


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
    event: dict[str, Any] = _header_attributes(headers)
    if kind:
        event["datacontenttype"] = headers.get("content-type", "")
    if kind and not (kind == "application/json" or kind.endswith("+json")):
        raise unsupported_media_type(
            "binary-mode data must be JSON (content-type application/json)"
        )
    event["data"] = decode_json(body)
    return event


def _header_attributes(headers: Mapping[str, str]) -> dict[str, str]:
    """The ``ce-`` headers as attributes, decoded as the HTTP binding says (§3.1.3.2): a
    value is printable ASCII, anything else percent-encoded as UTF-8, and "encoded byte
    sequences which are invalid in UTF-8 MUST be rejected". Replacing them instead (U+FFFD)
    would make ``evt-%FF`` and ``evt-%FE`` one event id. A header sent twice is refused too,
    as a repeated JSON key is: which one counts would be a guess."""
    attributes: dict[str, str] = {}
    for name, value in headers.items():  # Litestar's headers yield every line, repeats too
        header = name.lower()
        if not header.startswith("ce-"):
            continue
        if header[3:] in attributes:
            raise bad_request(
                f"the header {header} is sent more than once", code="duplicate_header"
            )
        attributes[header[3:]] = _percent_decoded(header, value)
    return attributes


def _percent_decoded(header: str, value: str) -> str:
    problem = None
    if not value.isascii():  # the server read the raw bytes as Latin-1
        problem = "holds a byte that is not ASCII; percent-encode it as UTF-8"
    elif STRAY_PERCENT.search(value):
        problem = "holds a '%' that starts no percent-encoded byte; send '%' as %25"
    else:
        try:
            return unquote(value, errors="strict")
        except UnicodeDecodeError:
            problem = "holds percent-encoded bytes that are not UTF-8"
    raise bad_request(f"the header {header} {problem}", code="invalid_header_encoding")
