"""Errors of POST /v1/traces as OTLP/HTTP says to send them: a ``google.rpc.Status``.

The OTLP/HTTP specification ("Failures") wants the body of every 4xx and 5xx reply to be a
``google.rpc.Status`` in the request's encoding, so that exporters and collectors can log
its message. The status code, headers (``Retry-After``) and the words are the ones the
rest of the API sends as problem documents (api/problems.py); only the envelope differs.
``Status.code`` (a gRPC code) is left out, as the specification allows.
"""

from __future__ import annotations

import json
from typing import Any, Final

from litestar import Request, Response

from api.cloudevents_http import media_type
from api.problems import EXCEPTION_HANDLERS

TRACES_PATH: Final = "/v1/traces"  # the route (api/otlp.py), and the rate limiter's reply
PROTOBUF: Final = "application/x-protobuf"
JSON: Final = "application/json"
# google.rpc.Status field 2 (message, a string): tag = 2 << 3 | wire type 2 (length-delimited).
STATUS_MESSAGE_TAG: Final = b"\x12"


def status_message(text: str) -> bytes:
    """A ``google.rpc.Status`` holding only ``message``, in protobuf's binary encoding
    (by hand: the message's class lives in googleapis-common-protos, not worth a dependency
    for one string field)."""
    encoded = text.encode()
    return STATUS_MESSAGE_TAG + _varint(len(encoded)) + encoded


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def status_body(text: str, request_content_type: str) -> tuple[bytes, str]:
    """(body, content type) of a Status saying ``text``, in the request's encoding."""
    if media_type(request_content_type) == PROTOBUF:
        return status_message(text), PROTOBUF
    # JSON, and a request in neither encoding (its 415): JSON is the readable one.
    return json.dumps({"message": text}).encode(), JSON


def _as_status(handler: Any) -> Any:
    def handle(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
        problem = handler(request, exc)
        body = problem.content
        text = f"{body.get('code', 'error')}: {body.get('detail', '')}"
        content, kind = status_body(text, request.headers.get("content-type", ""))
        headers = {k: v for k, v in problem.headers.items() if k.lower() == "retry-after"}
        return Response(content, status_code=problem.status_code, media_type=kind, headers=headers)

    return handle


# The API's handlers, each re-enveloped: same keys, so they replace the app's on this route.
OTLP_EXCEPTION_HANDLERS: Final[dict[Any, Any]] = {
    exception: _as_status(handler) for exception, handler in EXCEPTION_HANDLERS.items()
}
