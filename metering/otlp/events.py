"""One span → one CloudEvent in the shape ``POST /v1/events`` takes (docs/otlp.md).

Each builder raises :class:`Unmappable` with the reason a span cannot make a valid event,
so the span is rejected with that reason rather than sent to ingest to fail there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from metering.catalogue import MAX_COUNT, MAX_STEP, MAX_TEXT
from metering.ingest.validation import UNSTORABLE_CHARACTER
from metering.otlp.span import (
    ATTEMPT_ATTRIBUTE,
    CACHED_INPUT_TOKENS,
    ERROR_TYPE,
    INPUT_TOKENS,
    MODEL_ATTRIBUTES,
    OUTPUT_TOKENS,
    SERVICE_NAME,
    TOOL_CALL_ID,
    Span,
)
from metering.timestamps import canonical_time

# error.type → run.failed cause, first match wins. error.type is free text (an exception
# class, a provider's code, an HTTP status), so it is matched on its letters and digits.
# A tool's timeout is the tool's failure, so "tool" is tried before the network markers.
FAILURE_CAUSES: Final[tuple[tuple[str, tuple[str, ...]], ...]] = (
    ("tool", ("tool",)),
    ("network", ("timeout", "timedout", "connect", "network", "socket", "unknownhost", "dns")),
    (
        "provider",
        ("overload", "internalserver", "serviceunavailable", "servererror", "badgateway"),
    ),
)
HTTP_SERVER_ERROR: Final = re.compile(r"5\d\d")
SOURCE_PREFIX: Final = "otlp/"
MAX_SOURCE_CHARS: Final = 255


@dataclass(frozen=True, slots=True)
class Located:
    """A GenAI span with the run and customer it belongs to."""

    span: Span
    run: str
    customer: str


class Unmappable(Exception):
    """A span's attributes cannot make a valid event; the message is the reason."""


def usage_event(item: Located, step: int, tool_call_id: str | None) -> dict[str, Any]:
    """``run.usage``: the model that answered (the response's, else the requested one) and
    the tokens, cached input split out of input as Fairmeter prices them."""
    span = item.span
    model = next((value for name in MODEL_ATTRIBUTES if (value := span.attributes.get(name))), None)
    if not isinstance(model, str):
        raise Unmappable("no model: set gen_ai.response.model or gen_ai.request.model")
    _check_text(model, next(name for name in MODEL_ATTRIBUTES if span.attributes.get(name)))
    input_tokens = _count(span, INPUT_TOKENS)
    cached = _count(span, CACHED_INPUT_TOKENS)
    if cached > input_tokens:
        raise Unmappable(
            f"{CACHED_INPUT_TOKENS} ({cached}) exceeds {INPUT_TOKENS} ({input_tokens}), "
            "which should include it"
        )
    data: dict[str, Any] = {
        "step": step,
        "attempt": _attempt(span),
        "model": model,
        "input_tokens": input_tokens - cached,
        "cached_input_tokens": cached,
        "output_tokens": _count(span, OUTPUT_TOKENS),
    }
    if tool_call_id is not None:
        data["tool_call_id"] = _check_text(tool_call_id, TOOL_CALL_ID)
    return _event(item, "run.usage", "usage", data)


def tool_call_event(item: Located, step: int) -> dict[str, Any]:
    """``run.tool_call``: completed, or failed when the span ended in an error."""
    tool_call_id = item.span.attributes.get(TOOL_CALL_ID)
    if not isinstance(tool_call_id, str) or not tool_call_id:
        raise Unmappable(f"an execute_tool span without {TOOL_CALL_ID}")
    _check_text(tool_call_id, TOOL_CALL_ID)
    data = {
        "tool_call_id": tool_call_id,
        "step": step,
        "status": "failed" if item.span.failed else "completed",
        "attempt": _attempt(item.span),
    }
    return _event(item, "run.tool_call", "tool_call", data)


def terminal_event(item: Located) -> dict[str, Any]:
    """The agent span's end ends the run; one id for both outcomes, so a contradicting
    resend of the same span is a conflict at ingest, never a second terminal event."""
    data: dict[str, Any] = {"attempt": _attempt(item.span)}
    if not item.span.failed:
        return _event(item, "run.completed", "end", data)
    data["cause"] = failure_cause(item.span.attributes.get(ERROR_TYPE))
    return _event(item, "run.failed", "end", data)


def failure_cause(error_type: object) -> str:
    """``error.type`` → one of the causes metering's catalogue takes for ``run.failed``."""
    if not isinstance(error_type, str):
        return "unknown"
    if HTTP_SERVER_ERROR.fullmatch(error_type.strip()):
        return "provider"
    letters = re.sub(r"[^a-z0-9]", "", error_type.lower())
    for cause, markers in FAILURE_CAUSES:
        if any(marker in letters for marker in markers):
            return cause
    return "unknown"


def _check_text(value: str, name: str, limit: int = MAX_TEXT) -> str:
    """A text ingest can store. Ingest refuses a whole batch for one that it cannot, so
    the span alone is rejected here. (A lone surrogate never gets this far: protobuf and
    json_format refuse a string that is not UTF-8.)"""
    if not 0 < len(value) <= limit:
        raise Unmappable(f"{name} must be 1 to {limit} characters, not {len(value)}")
    found = UNSTORABLE_CHARACTER.search(value)
    if found:
        raise Unmappable(f"{name} holds U+{ord(found.group()):04X}, which cannot be stored")
    return value


def _count(span: Span, name: str) -> int:
    value = span.attributes.get(name, 0)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_COUNT:
        raise Unmappable(f"{name} must be an integer between 0 and {MAX_COUNT}, not {value!r}")
    return value


def _attempt(span: Span) -> int:
    """``fairmeter.attempt``, or 1. Baggage carries only strings, so digits are taken too."""
    value = span.attribute(ATTEMPT_ATTRIBUTE)
    if value is None:
        return 1
    if isinstance(value, str) and value.isascii() and value.isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_STEP:
        raise Unmappable(f"{ATTEMPT_ATTRIBUTE} must be an integer from 1, not {value!r}")
    return value


def _event(item: Located, event_type: str, kind: str, data: dict[str, Any]) -> dict[str, Any]:
    """A CloudEvent whose ``(source, id)`` is the span's for good: trace and span id, since
    a span id alone is unique only within its trace."""
    span = item.span
    service = span.resource.get(SERVICE_NAME)
    # "unknown_service" is what the OpenTelemetry SDKs report when service.name is unset.
    service_name = service if isinstance(service, str) and service else "unknown_service"
    source = SOURCE_PREFIX + _check_text(
        service_name, SERVICE_NAME, MAX_SOURCE_CHARS - len(SOURCE_PREFIX)
    )
    if span.end_ns <= 0:
        raise Unmappable("the span has no end time")
    return {
        "specversion": "1.0",
        "id": f"{span.trace_id}-{span.span_id}-{kind}",
        "source": source,
        "type": event_type,
        "subject": item.run,
        "time": canonical_time(_from_unix_nanos(span.end_ns)),
        "data": {"customer": item.customer, **data},
    }


def _from_unix_nanos(nanos: int) -> datetime:
    seconds, rest = divmod(nanos, 10**9)
    return datetime.fromtimestamp(seconds, UTC) + timedelta(microseconds=rest // 1000)
