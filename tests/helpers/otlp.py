"""An agent backend traced with the real OpenTelemetry SDK, for the OTLP tests (docs/otlp.md)."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from google.protobuf import json_format
from opentelemetry import baggage, context
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Span, SpanKind, Tracer


class InternalServerError(Exception):
    """Named like the provider SDKs' 5xx error (openai, anthropic)."""


class BaggageToAttributes(SpanProcessor):
    """What opentelemetry-processor-baggage's BaggageSpanProcessor does: every span started
    in a context carries its baggage as attributes. This is how a backend puts its run and
    customer on every span, including the framework's own (docs/otlp.md)."""

    def on_start(self, span: Any, parent_context: context.Context | None = None) -> None:
        for key, value in baggage.get_all(parent_context).items():
            span.set_attribute(key, str(value))


class Backend:
    """An agent backend traced with the real SDK; ``export()`` is what its exporter sends."""

    def __init__(
        self,
        *,
        sends_to: SpanExporter | None = None,
        response_model: str = "agent-large-1-2026-06",
        **resource: Any,
    ) -> None:
        """``sends_to``: an exporter the spans are also sent to in batches, as an SDK is set
        up in production (an OTLP exporter pointed at a server; ``flush()`` sends what has
        ended); ``response_model``: the model the provider says answered."""
        self.exporter = InMemorySpanExporter()
        self.response_model = response_model
        self.provider = TracerProvider(
            resource=Resource.create({"service.name": "support-agent", **resource})
        )
        self.provider.add_span_processor(BaggageToAttributes())
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        if sends_to is not None:
            self.provider.add_span_processor(BatchSpanProcessor(sends_to))
        self.tracer: Tracer = self.provider.get_tracer("agent-framework", "1.0.0")

    @contextmanager
    def baggage(self, **entries: str) -> Iterator[None]:
        """Entries (a run id, a customer) that every span started inside carries."""
        ctx = context.get_current()
        for key, value in entries.items():
            ctx = baggage.set_baggage(key, value, ctx)
        token = context.attach(ctx)
        try:
            yield
        finally:
            context.detach(token)

    @contextmanager
    def agent(self, **attributes: Any) -> Iterator[Span]:
        with self._operation("invoke_agent", "invoke_agent support-bot", attributes) as span:
            yield span

    @contextmanager
    def tool(self, call_id: str, **attributes: Any) -> Iterator[Span]:
        attributes = {
            "gen_ai.tool.name": "lookup_order",
            "gen_ai.tool.call.id": call_id,
            **attributes,
        }
        with self._operation("execute_tool", "execute_tool lookup_order", attributes) as span:
            yield span

    def chat(self, *, input_tokens: int | None, output_tokens: int | None, **usage: Any) -> None:
        """One model call; the instrumentation records usage when the response arrives."""
        attributes = {"gen_ai.request.model": "agent-large-1", "gen_ai.provider.name": "openai"}
        with self._operation("chat", "chat agent-large-1", attributes, SpanKind.CLIENT) as span:
            span.set_attribute("gen_ai.response.model", self.response_model)
            for name, value in (
                ("gen_ai.usage.input_tokens", input_tokens),
                ("gen_ai.usage.output_tokens", output_tokens),
                *usage.items(),
            ):
                if value is not None:
                    span.set_attribute(name, value)

    @contextmanager
    def _operation(
        self,
        operation: str,
        name: str,
        attributes: dict[str, Any],
        kind: SpanKind = SpanKind.INTERNAL,
    ) -> Iterator[Span]:
        """As GenAI instrumentations do: error.type is the exception's class on failure
        (the SDK itself sets the span's status to ERROR and records the exception)."""
        attributes = {"gen_ai.operation.name": operation, **attributes}
        with self.tracer.start_as_current_span(name, kind=kind, attributes=attributes) as span:
            try:
                yield span
            except Exception as error:
                span.set_attribute("error.type", type(error).__qualname__)
                raise

    def flush(self) -> None:
        """Send the ended spans now (the batch processor's own timer would, within 5 s)."""
        assert self.provider.force_flush(timeout_millis=10_000)

    def finished_spans(self) -> tuple[ReadableSpan, ...]:
        return self.exporter.get_finished_spans()

    def export(self) -> ExportTraceServiceRequest:
        return encode_spans(self.exporter.get_finished_spans())


def otlp_json(request: ExportTraceServiceRequest) -> bytes:
    """The OTLP/JSON form of ``request``: protobuf's JSON mapping, but with trace and span
    ids in hex, as the OTLP specification's "JSON Protobuf Encoding" requires."""
    document = json_format.MessageToDict(request)
    for resource_spans in document["resourceSpans"]:
        for scope_spans in resource_spans["scopeSpans"]:
            for span in scope_spans["spans"]:
                for message in (span, *span.get("links", [])):
                    for name in ("traceId", "spanId", "parentSpanId"):
                        if name in message:
                            message[name] = base64.b64decode(message[name]).hex()
    return json.dumps(document).encode()


def one_chat_json(run: str, customer: str, model: str = "agent-small-1") -> bytes:
    """An OTLP/JSON export of one model call of ``run`` for ``customer``, ended a second ago:
    a valid body for ``POST /v1/traces`` where a test needs one without an SDK."""
    end_ns = time.time_ns() - 1_000_000_000
    attributes = {
        "gen_ai.operation.name": {"stringValue": "chat"},
        "gen_ai.request.model": {"stringValue": model},
        "gen_ai.usage.input_tokens": {"intValue": "100"},
        "gen_ai.usage.output_tokens": {"intValue": "10"},
        "fairmeter.run.id": {"stringValue": run},
        "fairmeter.customer.id": {"stringValue": customer},
    }
    span = {
        "traceId": "5b8efff798038103d269b633813fc60c",
        "spanId": "eee19b7ec3c1b174",
        "name": f"chat {model}",
        "kind": 3,
        "startTimeUnixNano": str(end_ns - 500_000_000),
        "endTimeUnixNano": str(end_ns),
        "attributes": [{"key": key, "value": value} for key, value in attributes.items()],
    }
    service = {"key": "service.name", "value": {"stringValue": "probe"}}
    document = {
        "resourceSpans": [
            {"resource": {"attributes": [service]}, "scopeSpans": [{"spans": [span]}]}
        ]
    }
    return json.dumps(document).encode()
