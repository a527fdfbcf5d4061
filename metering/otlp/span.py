"""A span as the mapping reads it, and the attribute names it reads (docs/otlp.md).

The names are the GenAI semantic conventions' (open-telemetry/semantic-conventions,
docs/gen-ai/, since moved to open-telemetry/semantic-conventions-genai) and Fairmeter's
own ``fairmeter.*``; each is defined here once, for the mapping and the docs alike.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Status

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


@dataclass(frozen=True, slots=True)
class Span:
    """One span with its resource's attributes; ids in lower-case hex."""

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


def spans_of(request: ExportTraceServiceRequest) -> Iterator[Span]:
    """Every span of an export request, flattened out of its resource and scope."""
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for raw in scope_spans.spans:
                yield Span(
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


def _attributes(pairs: Any) -> dict[str, object]:
    """Scalar attribute values by key; arrays and maps mean nothing to the mapping."""
    values: dict[str, object] = {}
    for pair in pairs:
        assert isinstance(pair, KeyValue)
        kind = pair.value.WhichOneof("value")
        if kind in ("string_value", "int_value", "bool_value", "double_value"):
            values[pair.key] = getattr(pair.value, kind)
    return values
