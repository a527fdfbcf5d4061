"""Pure mapping: OTLP GenAI spans → Fairmeter CloudEvents (issue #19; docs/otlp.md).

Agent backends already emit OpenTelemetry traces per the GenAI semantic conventions, so a
backend that is traced needs no second integration to be metered. This module only decides
which event each span means; it does no I/O, and its events are plain dicts in the shape
``POST /v1/events`` takes, so the one ingest validation (``metering.ingest.validation``)
judges them like any other event.

Three rules keep a bill honest:

* **Never guess who pays.** A span naming no customer is rejected with a reason, not
  charged to a default.
* **A retry is a duplicate.** Event ids come from the trace and span ids, so an exporter
  resending a request yields the same ``(source, id)`` pairs, which ingest stores once.
* **Every span is accounted for**: mapped, ignored (counted) or rejected (with a reason).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Status

from metering.catalogue import MAX_COUNT, MAX_STEP
from metering.ids import IdKind, id_problem
from metering.timestamps import canonical_time

# The GenAI semantic conventions (open-telemetry/semantic-conventions, docs/gen-ai/, moved
# to open-telemetry/semantic-conventions-genai in 2026; cited in docs/otlp.md).
OPERATION: Final = "gen_ai.operation.name"
USAGE_OPERATIONS: Final = frozenset({"chat", "text_completion", "generate_content"})
TOOL_OPERATION: Final = "execute_tool"
AGENT_OPERATION: Final = "invoke_agent"
INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
# Included in gen_ai.usage.input_tokens by the conventions; Fairmeter prices the two
# classes separately and adds them, so the cached part is taken out of input_tokens.
CACHED_INPUT_TOKENS: Final = "gen_ai.usage.cache_read.input_tokens"
MODEL_ATTRIBUTES: Final = ("gen_ai.response.model", "gen_ai.request.model")
TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
ERROR_TYPE: Final = "error.type"
SERVICE_NAME: Final = "service.name"
# Fairmeter's own attributes come first: the backend knows its run and customer best.
RUN_ID_ATTRIBUTES: Final = ("fairmeter.run.id", "gen_ai.conversation.id")
CUSTOMER_ATTRIBUTES: Final = ("fairmeter.customer.id", "enduser.id")
ATTEMPT_ATTRIBUTE: Final = "fairmeter.attempt"

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
class RejectedSpan:
    """A GenAI span that would have meant an event but cannot be mapped, and why."""

    trace_id: str
    span_id: str
    name: str
    reason: str


@dataclass(frozen=True, slots=True)
class MappedSpans:
    """What one export request means: events to ingest, and how every span was treated."""

    events: tuple[dict[str, Any], ...]
    accepted_spans: int
    ignored_non_genai_spans: int
    ignored_without_usage_spans: int
    ignored_nested_agent_spans: int
    duplicate_spans: int
    rejected: tuple[RejectedSpan, ...]


@dataclass(frozen=True, slots=True)
class _Span:
    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    start_ns: int
    end_ns: int
    status_error: bool
    attributes: Mapping[str, object]
    resource: Mapping[str, object]

    def attribute(self, *names: str) -> object | None:
        """The first of ``names`` set on the span, else on its resource."""
        for scope in (self.attributes, self.resource):
            for name in names:
                if scope.get(name) is not None:
                    return scope[name]
        return None

    @property
    def operation(self) -> object | None:
        return self.attributes.get(OPERATION)

    @property
    def failed(self) -> bool:
        return self.status_error or self.attributes.get(ERROR_TYPE) is not None

    @property
    def order(self) -> tuple[int, str]:
        return (self.start_ns, self.span_id)


@dataclass(frozen=True, slots=True)
class _Located:
    """A GenAI span with the run and customer it belongs to."""

    span: _Span
    run: str
    customer: str


@dataclass
class _Tally:
    non_genai: int = 0
    without_usage: int = 0
    nested_agents: int = 0
    duplicates: int = 0
    rejected: list[RejectedSpan] = field(default_factory=list)

    def reject(self, span: _Span, reason: str) -> None:
        self.rejected.append(RejectedSpan(span.trace_id, span.span_id, span.name, reason))


class _Unmappable(Exception):
    """A span's attributes cannot make a valid event; the message is the reason."""


def map_spans(request: ExportTraceServiceRequest) -> MappedSpans:
    """Every span of ``request`` → events, ignores and rejections (see docs/otlp.md).

    Deterministic for a given request, so an exporter's retry maps to the same events.
    """
    tally = _Tally()
    spans = list(_unique_spans(request, tally))
    nested = _nested_agents(spans)
    genai = [span for span in spans if _is_billable(span, nested, tally)]
    located = _agreeing(_located(genai, tally), tally)
    events: list[dict[str, Any]] = []
    for run_spans in _by_run(located).values():
        events.extend(_run_events(run_spans, tally))
    return MappedSpans(
        events=tuple(events),
        accepted_spans=len(events),
        ignored_non_genai_spans=tally.non_genai,
        ignored_without_usage_spans=tally.without_usage,
        ignored_nested_agent_spans=tally.nested_agents,
        duplicate_spans=tally.duplicates,
        rejected=tuple(tally.rejected),
    )


def _unique_spans(request: ExportTraceServiceRequest, tally: _Tally) -> Iterator[_Span]:
    """Each span once: a span sent twice in one request (a merged retry) is one span."""
    seen: set[tuple[str, str]] = set()
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for raw in scope_spans.spans:
                span = _Span(
                    trace_id=raw.trace_id.hex(),
                    span_id=raw.span_id.hex(),
                    parent_span_id=raw.parent_span_id.hex(),
                    name=raw.name,
                    start_ns=raw.start_time_unix_nano,
                    end_ns=raw.end_time_unix_nano,
                    status_error=raw.status.code == Status.STATUS_CODE_ERROR,
                    attributes=_attributes(raw.attributes),
                    resource=resource,
                )
                key = (span.trace_id, span.span_id)
                if key in seen:
                    tally.duplicates += 1
                    continue
                seen.add(key)
                yield span


def _attributes(pairs: Any) -> dict[str, object]:
    """Scalar attribute values by key; arrays and maps mean nothing to the mapping."""
    values: dict[str, object] = {}
    for pair in pairs:
        assert isinstance(pair, KeyValue)
        kind = pair.value.WhichOneof("value")
        if kind in ("string_value", "int_value", "bool_value", "double_value"):
            values[pair.key] = getattr(pair.value, kind)
    return values


def _nested_agents(spans: list[_Span]) -> set[tuple[str, str]]:
    """The invoke_agent spans inside another one of the request (a sub-agent, a handoff):
    only the outermost agent's end ends the run, else one run would end twice."""
    by_id = {(span.trace_id, span.span_id): span for span in spans}
    nested = set()
    for span in spans:
        if span.operation != AGENT_OPERATION:
            continue
        parent = by_id.get((span.trace_id, span.parent_span_id))
        while parent is not None and parent.operation != AGENT_OPERATION:
            parent = by_id.get((parent.trace_id, parent.parent_span_id))
        if parent is not None:
            nested.add((span.trace_id, span.span_id))
    return nested


def _is_billable(span: _Span, nested: set[tuple[str, str]], tally: _Tally) -> bool:
    """Agent, tool and inference-with-usage spans mean events; the rest is counted."""
    operation = span.operation
    if not isinstance(operation, str):
        tally.non_genai += 1
        return False
    if operation == AGENT_OPERATION and (span.trace_id, span.span_id) in nested:
        tally.nested_agents += 1
        return False
    if operation in (AGENT_OPERATION, TOOL_OPERATION):
        return True
    if operation in USAGE_OPERATIONS and (
        span.attributes.get(INPUT_TOKENS) is not None
        or span.attributes.get(OUTPUT_TOKENS) is not None
    ):
        return True
    tally.without_usage += 1  # embeddings, create_agent, or a call that reported no usage
    return False


def _located(spans: list[_Span], tally: _Tally) -> list[_Located]:
    located = []
    for span in spans:
        try:
            located.append(_Located(span, _run_id(span), _customer(span)))
        except _Unmappable as problem:
            tally.reject(span, str(problem))
    return located


def _run_id(span: _Span) -> str:
    run = span.attribute(RUN_ID_ATTRIBUTES[0])
    if run is None:
        run = span.attributes.get(RUN_ID_ATTRIBUTES[1])
    if run is None:
        return span.trace_id  # the invoke_agent span's too: one trace is one run
    if not isinstance(run, str) or id_problem(run, IdKind.RUN):
        raise _Unmappable(f"run id {run!r} is not a valid run id: {id_problem(run, IdKind.RUN)}")
    return run


def _customer(span: _Span) -> str:
    customer = span.attribute(*CUSTOMER_ATTRIBUTES)
    if customer is None:
        names = " or ".join(CUSTOMER_ATTRIBUTES)
        raise _Unmappable(f"no customer: set {names} on the span or its resource")
    problem = id_problem(customer, IdKind.CUSTOMER)
    if problem:
        raise _Unmappable(f"customer {customer!r} is not a valid customer id: {problem}")
    assert isinstance(customer, str)
    return customer


def _agreeing(located: list[_Located], tally: _Tally) -> list[_Located]:
    """Drop spans that contradict their trace's agent span or their run's customer.

    A run id set on the invoke_agent span alone would put its children (which fall back to
    the trace id) in another run; a second customer would make ingest refuse the whole
    batch. Either is a backend's mistake to be shown, not papered over.
    """
    agent_runs = {
        item.span.trace_id: item.run for item in located if item.span.operation == AGENT_OPERATION
    }
    first_customer: dict[str, _Located] = {}
    agreeing = []
    for item in sorted(located, key=lambda item: item.span.order):
        agent_run = agent_runs.get(item.span.trace_id, item.run)
        if agent_run != item.run:
            tally.reject(
                item.span,
                f"run {item.run} differs from its invoke_agent span's run {agent_run}: set "
                "fairmeter.run.id or gen_ai.conversation.id on every span, or on the resource",
            )
            continue
        first = first_customer.setdefault(item.run, item)
        if first.customer != item.customer:
            tally.reject(
                item.span,
                f"run {item.run} belongs to customer {first.customer}, not {item.customer}",
            )
            continue
        agreeing.append(item)
    return agreeing


def _by_run(located: list[_Located]) -> dict[str, list[_Located]]:
    runs: dict[str, list[_Located]] = defaultdict(list)
    for item in located:  # already in start order
        runs[item.run].append(item)
    return runs


def _run_events(run_spans: list[_Located], tally: _Tally) -> list[dict[str, Any]]:
    """One run's events, in the order they happened (span end). ``step`` counts the run's
    inference spans in start order from 1; a tool call takes the step of the inference
    that started before it (the one that asked for it).
    """
    step = 0
    ended: list[tuple[int, str, dict[str, Any]]] = []
    for item in run_spans:
        operation = item.span.operation
        if operation in USAGE_OPERATIONS:
            step += 1
        try:
            if operation == AGENT_OPERATION:
                event = _terminal_event(item)
            elif operation == TOOL_OPERATION:
                event = _tool_call_event(item, step)
            else:
                event = _usage_event(item, step, _tool_call_of(item.span, run_spans))
        except _Unmappable as problem:
            tally.reject(item.span, str(problem))
            continue
        ended.append((item.span.end_ns, item.span.span_id, event))
    return [event for _, _, event in sorted(ended, key=lambda entry: entry[:2])]


def _usage_event(item: _Located, step: int, tool_call_id: str | None) -> dict[str, Any]:
    span = item.span
    model = next((value for name in MODEL_ATTRIBUTES if (value := span.attributes.get(name))), None)
    if not isinstance(model, str):
        raise _Unmappable("no model: set gen_ai.response.model or gen_ai.request.model")
    input_tokens = _count(span, INPUT_TOKENS)
    cached = _count(span, CACHED_INPUT_TOKENS)
    if cached > input_tokens:
        raise _Unmappable(
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
        data["tool_call_id"] = tool_call_id
    return _event(item, "run.usage", "usage", data)


def _tool_call_of(span: _Span, run_spans: list[_Located]) -> str | None:
    """The tool call an inference ran inside (its own attribute, else an ancestor
    execute_tool span in the request), so re-running a completed call is credited (R1)."""
    own = span.attributes.get(TOOL_CALL_ID)
    if isinstance(own, str):
        return own
    by_id = {item.span.span_id: item.span for item in run_spans}
    parent = by_id.get(span.parent_span_id)
    while parent is not None:
        parent_call = parent.attributes.get(TOOL_CALL_ID)
        if parent.operation == TOOL_OPERATION and isinstance(parent_call, str):
            return parent_call
        parent = by_id.get(parent.parent_span_id)
    return None


def _tool_call_event(item: _Located, step: int) -> dict[str, Any]:
    tool_call_id = item.span.attributes.get(TOOL_CALL_ID)
    if not isinstance(tool_call_id, str) or not tool_call_id:
        raise _Unmappable(f"an execute_tool span without {TOOL_CALL_ID}")
    data = {
        "tool_call_id": tool_call_id,
        "step": step,
        "status": "failed" if item.span.failed else "completed",
        "attempt": _attempt(item.span),
    }
    return _event(item, "run.tool_call", "tool_call", data)


def _terminal_event(item: _Located) -> dict[str, Any]:
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


def _count(span: _Span, name: str) -> int:
    value = span.attributes.get(name, 0)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_COUNT:
        raise _Unmappable(f"{name} must be an integer between 0 and {MAX_COUNT}, not {value!r}")
    return value


def _attempt(span: _Span) -> int:
    """``fairmeter.attempt``, or 1. Baggage carries only strings, so digits are taken too."""
    value = span.attribute(ATTEMPT_ATTRIBUTE)
    if value is None:
        return 1
    if isinstance(value, str) and value.isascii() and value.isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_STEP:
        raise _Unmappable(f"{ATTEMPT_ATTRIBUTE} must be an integer from 1, not {value!r}")
    return value


def _event(item: _Located, event_type: str, kind: str, data: dict[str, Any]) -> dict[str, Any]:
    """A CloudEvent whose ``(source, id)`` is the span's for good: trace and span id, since
    a span id alone is unique only within its trace."""
    span = item.span
    service = span.resource.get(SERVICE_NAME)
    # "unknown_service" is what the OpenTelemetry SDKs report when service.name is unset.
    service_name = service if isinstance(service, str) and service else "unknown_service"
    source = SOURCE_PREFIX + service_name
    if len(source) > MAX_SOURCE_CHARS:
        raise _Unmappable(f"service.name is longer than {MAX_SOURCE_CHARS - len(SOURCE_PREFIX)}")
    if span.end_ns <= 0:
        raise _Unmappable("the span has no end time")
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
