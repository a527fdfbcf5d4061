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

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)

from metering.ids import IdKind, id_problem
from metering.otlp.events import Located, Unmappable, terminal_event, tool_call_event, usage_event
from metering.otlp.span import (
    AGENT_OPERATION,
    CUSTOMER_ATTRIBUTES,
    INPUT_TOKENS,
    OUTPUT_TOKENS,
    RUN_ID_ATTRIBUTES,
    TOOL_CALL_ID,
    TOOL_OPERATION,
    USAGE_OPERATIONS,
    Span,
    spans_of,
)


@dataclass(frozen=True, slots=True)
class RejectedSpan:
    """A GenAI span that would have meant an event but cannot be mapped, and why."""

    trace_id: str
    span_id: str
    name: str
    reason: str

    def describe(self) -> str:
        """The reason naming the span, as an exporter's log shows it."""
        return f"span {self.name!r} ({self.trace_id}/{self.span_id}): {self.reason}"


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


# Real agent traces nest a few levels (agent → tool → sub-agent → model call); 64 is far
# beyond them and bounds the work a hostile request can ask for.
MAX_ANCESTRY: Final = 64
_SpansById = dict[tuple[str, str], Span]


@dataclass
class _Tally:
    non_genai: int = 0
    without_usage: int = 0
    nested_agents: int = 0
    duplicates: int = 0
    rejected: list[RejectedSpan] = field(default_factory=list)

    def reject(self, span: Span, reason: str) -> None:
        self.rejected.append(RejectedSpan(span.trace_id, span.span_id, span.name, reason))


def map_spans(request: ExportTraceServiceRequest) -> MappedSpans:
    """Every span of ``request`` → events, ignores and rejections (see docs/otlp.md).

    Deterministic for a given request, so an exporter's retry maps to the same events.
    """
    tally = _Tally()
    spans = list(_unique_spans(request, tally))
    by_id = {(span.trace_id, span.span_id): span for span in spans}
    nested = _nested_agents(spans, by_id)
    genai = [span for span in spans if _is_billable(span, nested, tally)]
    located = _agreeing(_located(genai, tally), tally)
    events: list[dict[str, Any]] = []
    for run_spans in _by_run(located).values():
        events.extend(_run_events(run_spans, by_id, tally))
    return MappedSpans(
        events=tuple(events),
        accepted_spans=len(events),
        ignored_non_genai_spans=tally.non_genai,
        ignored_without_usage_spans=tally.without_usage,
        ignored_nested_agent_spans=tally.nested_agents,
        duplicate_spans=tally.duplicates,
        rejected=tuple(tally.rejected),
    )


def _unique_spans(request: ExportTraceServiceRequest, tally: _Tally) -> Iterator[Span]:
    """Each span once: a span sent twice in one request (a merged retry) is one span."""
    seen: set[tuple[str, str]] = set()
    for span in spans_of(request):
        key = (span.trace_id, span.span_id)
        if key in seen:
            tally.duplicates += 1
            continue
        seen.add(key)
        yield span


def _ancestors(span: Span, by_id: _SpansById) -> Iterator[Span]:
    """The span's parent, its parent's, … as far as the request holds them, at most
    ``MAX_ANCESTRY`` up. Parent ids are the sender's word: a cycle among them ends the
    walk, and the bound keeps a request of one long chain from costing n² steps."""
    seen = {span.span_id}
    parent = by_id.get((span.trace_id, span.parent_span_id))
    while parent is not None and parent.span_id not in seen and len(seen) <= MAX_ANCESTRY:
        seen.add(parent.span_id)
        yield parent
        parent = by_id.get((parent.trace_id, parent.parent_span_id))


def _nested_agents(spans: list[Span], by_id: _SpansById) -> set[tuple[str, str]]:
    """The invoke_agent spans inside another one of the request (a sub-agent, a handoff):
    only the outermost agent's end ends the run, else one run would end twice."""
    return {
        (span.trace_id, span.span_id)
        for span in spans
        if span.operation == AGENT_OPERATION
        and any(parent.operation == AGENT_OPERATION for parent in _ancestors(span, by_id))
    }


def _is_billable(span: Span, nested: set[tuple[str, str]], tally: _Tally) -> bool:
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


def _located(spans: list[Span], tally: _Tally) -> list[Located]:
    located = []
    for span in spans:
        try:
            located.append(Located(span, _run_id(span), _customer(span)))
        except Unmappable as problem:
            tally.reject(span, str(problem))
    return located


def _run_id(span: Span) -> str:
    run = span.attribute(RUN_ID_ATTRIBUTES[0])
    if run is None:
        run = span.attributes.get(RUN_ID_ATTRIBUTES[1])
    if run is None:
        return span.trace_id  # the invoke_agent span's too: one trace is one run
    if not isinstance(run, str) or id_problem(run, IdKind.RUN):
        raise Unmappable(f"run id {run!r} is not a valid run id: {id_problem(run, IdKind.RUN)}")
    return run


def _customer(span: Span) -> str:
    customer = span.attribute(*CUSTOMER_ATTRIBUTES)
    if customer is None:
        names = " or ".join(CUSTOMER_ATTRIBUTES)
        raise Unmappable(f"no customer: set {names} on the span or its resource")
    problem = id_problem(customer, IdKind.CUSTOMER)
    if problem:
        raise Unmappable(f"customer {customer!r} is not a valid customer id: {problem}")
    assert isinstance(customer, str)
    return customer


def _agreeing(located: list[Located], tally: _Tally) -> list[Located]:
    """Drop spans that contradict their trace's agent span or their run's customer.

    A run id set on the invoke_agent span alone would put its children (which fall back to
    the trace id) in another run; a second customer would make ingest refuse the whole
    batch. Either is a backend's mistake to be shown, not papered over.
    """
    agent_runs = {
        item.span.trace_id: item.run for item in located if item.span.operation == AGENT_OPERATION
    }
    first_customer: dict[str, Located] = {}
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


def _by_run(located: list[Located]) -> dict[str, list[Located]]:
    runs: dict[str, list[Located]] = defaultdict(list)
    for item in located:  # already in start order
        runs[item.run].append(item)
    return runs


def _run_events(run_spans: list[Located], by_id: _SpansById, tally: _Tally) -> list[dict[str, Any]]:
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
                event = terminal_event(item)
            elif operation == TOOL_OPERATION:
                event = tool_call_event(item, step)
            else:
                event = usage_event(item, step, _tool_call_of(item.span, by_id))
        except Unmappable as problem:
            tally.reject(item.span, str(problem))
            continue
        ended.append((item.span.end_ns, item.span.span_id, event))
    return [event for _, _, event in sorted(ended, key=lambda entry: entry[:2])]


def _tool_call_of(span: Span, by_id: _SpansById) -> str | None:
    """The tool call an inference ran inside (its own attribute, else an ancestor
    execute_tool span in the request), so re-running a completed call is credited (R1)."""
    own = span.attributes.get(TOOL_CALL_ID)
    if isinstance(own, str):
        return own
    for parent in _ancestors(span, by_id):
        parent_call = parent.attributes.get(TOOL_CALL_ID)
        if parent.operation == TOOL_OPERATION and isinstance(parent_call, str):
            return parent_call
    return None
