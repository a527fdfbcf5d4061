"""OTLP GenAI spans → Fairmeter events (issue #19; docs/otlp.md).

The spans are made by the real OpenTelemetry SDK the way an instrumented agent framework
makes them, and encoded by the real OTLP exporter's encoder, so the mapping is tested on
the messages a backend actually sends. Every mapped event must pass ingest's validation.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource as Resource_
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan
from opentelemetry.trace import Link, SpanKind

from metering.catalogue import EVENT_TYPES
from metering.errors import MeteringError
from metering.ingest.validation import TimeWindow, validate_batch
from metering.otlp import MappedSpans, decode_otlp_json, failure_cause, map_spans
from metering.otlp.events import FAILURE_CAUSES
from tests.helpers.otlp import Backend, InternalServerError, otlp_json


def assert_ingest_accepts(mapped: MappedSpans) -> None:
    window = TimeWindow(
        now=datetime.now(UTC), max_future=timedelta(minutes=5), max_age=timedelta(days=35)
    )
    valid, errors = validate_batch(list(mapped.events), window)
    assert errors == []
    assert len(valid) == len(mapped.events)


def types_of(mapped: MappedSpans) -> list[str]:
    return [event["type"] for event in mapped.events]


def test_completed_run_maps_to_usage_per_chat_a_tool_call_and_completed() -> None:
    backend = Backend()
    run = {"fairmeter.run.id": "run-42", "fairmeter.customer.id": "cust-7"}
    with backend.baggage(**run), backend.agent():
        backend.chat(
            input_tokens=1200, output_tokens=300, **{"gen_ai.usage.cache_read.input_tokens": 200}
        )
        with backend.tool("call_1"):
            pass
        backend.chat(input_tokens=1500, output_tokens=80)

    mapped = map_spans(backend.export())

    assert types_of(mapped) == ["run.usage", "run.tool_call", "run.usage", "run.completed"]
    first, tool, second, end = mapped.events
    assert first["data"] == {
        "customer": "cust-7",
        "step": 1,
        "attempt": 1,
        "model": "agent-large-1-2026-06",  # the response's model: what was billed
        "input_tokens": 1000,  # OTel's input_tokens includes the cached ones
        "cached_input_tokens": 200,
        "output_tokens": 300,
    }
    assert tool["data"] == {
        "customer": "cust-7",
        "tool_call_id": "call_1",
        "step": 1,
        "status": "completed",
        "attempt": 1,
    }
    assert second["data"]["step"] == 2
    assert end["data"] == {"customer": "cust-7", "attempt": 1}
    assert {event["subject"] for event in mapped.events} == {"run-42"}
    assert {event["source"] for event in mapped.events} == {"otlp/support-agent"}
    assert len({event["id"] for event in mapped.events}) == 4
    assert (mapped.accepted_spans, mapped.rejected) == (4, ())
    assert_ingest_accepts(mapped)


def test_failed_run_after_a_provider_error_maps_to_run_failed_with_cause_provider() -> None:
    backend = Backend(**{"fairmeter.customer.id": "cust-7"})
    with (
        backend.baggage(**{"fairmeter.run.id": "run-43"}),
        pytest.raises(InternalServerError),
        backend.agent(),
    ):
        backend.chat(input_tokens=900, output_tokens=40)
        backend.chat(input_tokens=None, output_tokens=None)  # the call the provider failed
        raise InternalServerError("503 from the provider")

    mapped = map_spans(backend.export())

    assert types_of(mapped) == ["run.usage", "run.failed"]
    assert mapped.events[-1]["data"] == {"customer": "cust-7", "attempt": 1, "cause": "provider"}
    assert mapped.ignored_without_usage_spans == 1
    assert_ingest_accepts(mapped)


def test_a_tool_call_run_twice_under_one_id_maps_to_two_tool_calls_and_tags_its_usage() -> None:
    """The same gen_ai.tool.call.id twice is what R1 credits: both calls are reported (each
    span its own event id) and the model call made inside the second names the tool call."""
    backend = Backend(**{"enduser.id": "cust-7"})
    with backend.baggage(**{"gen_ai.conversation.id": "conv-9"}), backend.agent():
        backend.chat(input_tokens=100, output_tokens=10)
        with backend.tool("call_1"):
            pass
        with backend.tool("call_1"):
            backend.chat(input_tokens=50, output_tokens=5)

    mapped = map_spans(backend.export())

    tool_calls = [event for event in mapped.events if event["type"] == "run.tool_call"]
    assert [call["data"]["tool_call_id"] for call in tool_calls] == ["call_1", "call_1"]
    assert tool_calls[0]["id"] != tool_calls[1]["id"]
    inner_usage = [event for event in mapped.events if event["type"] == "run.usage"][1]
    assert inner_usage["data"]["tool_call_id"] == "call_1"
    assert {event["subject"] for event in mapped.events} == {"conv-9"}
    assert_ingest_accepts(mapped)


def test_a_failed_tool_span_maps_to_a_failed_tool_call() -> None:
    backend = Backend(**{"enduser.id": "cust-7"})
    with backend.agent(), pytest.raises(LookupError), backend.tool("call_2"):
        raise LookupError("no such order")

    tool_call = map_spans(backend.export()).events[0]

    assert tool_call["data"]["status"] == "failed"


def test_a_span_naming_no_customer_is_rejected_with_a_reason_never_charged_to_a_guess() -> None:
    backend = Backend()
    with backend.agent():
        backend.chat(input_tokens=100, output_tokens=10)

    mapped = map_spans(backend.export())

    assert mapped.events == ()
    assert [rejection.name for rejection in mapped.rejected] == [
        "chat agent-large-1",
        "invoke_agent support-bot",
    ]
    assert all(
        "no customer: set fairmeter.customer.id or enduser.id" in rejection.reason
        for rejection in mapped.rejected
    )


def test_non_genai_spans_are_ignored_and_counted() -> None:
    backend = Backend(**{"enduser.id": "cust-7"})
    with backend.agent():
        with backend.tracer.start_as_current_span("GET /orders", kind=SpanKind.CLIENT) as span:
            span.set_attribute("http.request.method", "GET")
        backend.chat(input_tokens=100, output_tokens=10)

    mapped = map_spans(backend.export())

    assert types_of(mapped) == ["run.usage", "run.completed"]
    assert (mapped.ignored_non_genai_spans, mapped.ignored_without_usage_spans) == (1, 0)


def test_a_sub_agent_does_not_end_the_run_its_outer_agent_ends_it() -> None:
    backend = Backend(**{"enduser.id": "cust-7"})
    with backend.agent(), backend.tool("call_1"), backend.agent():
        backend.chat(input_tokens=100, output_tokens=10)

    mapped = map_spans(backend.export())

    assert types_of(mapped) == ["run.usage", "run.tool_call", "run.completed"]
    assert mapped.ignored_nested_agent_spans == 1
    assert_ingest_accepts(mapped)


def test_without_a_run_id_the_trace_is_the_run() -> None:
    backend = Backend(**{"enduser.id": "cust-7"})
    with backend.agent() as agent:
        backend.chat(input_tokens=100, output_tokens=10)
    trace_id = f"{agent.get_span_context().trace_id:032x}"

    mapped = map_spans(backend.export())

    assert {event["subject"] for event in mapped.events} == {trace_id}
    assert_ingest_accepts(mapped)


def test_a_run_id_on_the_agent_span_alone_rejects_its_children_instead_of_splitting_the_run() -> (
    None
):
    backend = Backend(**{"enduser.id": "cust-7"})
    with backend.agent(**{"gen_ai.conversation.id": "conv-9"}):
        # a model call with no conversation id would fall back to the trace id
        with backend.tracer.start_as_current_span("chat", attributes={}) as span:
            span.set_attributes(
                {
                    "gen_ai.operation.name": "chat",
                    "gen_ai.request.model": "agent-large-1",
                    "gen_ai.usage.input_tokens": 10,
                    "gen_ai.usage.output_tokens": 1,
                }
            )
        backend.chat(input_tokens=5, output_tokens=1, **{"gen_ai.conversation.id": "conv-9"})

    mapped = map_spans(backend.export())

    assert types_of(mapped) == ["run.usage", "run.completed"]
    assert len(mapped.rejected) == 1
    assert "differs from its invoke_agent span's run conv-9" in mapped.rejected[0].reason


def test_cached_tokens_above_input_tokens_are_rejected_not_billed_negative() -> None:
    backend = Backend(**{"enduser.id": "cust-7"})
    with backend.agent():
        backend.chat(
            input_tokens=100, output_tokens=1, **{"gen_ai.usage.cache_read.input_tokens": 101}
        )

    mapped = map_spans(backend.export())

    assert types_of(mapped) == ["run.completed"]
    assert "exceeds gen_ai.usage.input_tokens" in mapped.rejected[0].reason


def test_an_exporters_retry_maps_to_the_same_events_and_a_resent_span_counts_once() -> None:
    backend = Backend(**{"enduser.id": "cust-7"})
    with (
        backend.baggage(**{"fairmeter.run.id": "run-44", "fairmeter.attempt": "2"}),
        backend.agent(),
    ):
        backend.chat(input_tokens=100, output_tokens=10)
    request = backend.export()
    doubled = ExportTraceServiceRequest()
    doubled.resource_spans.extend([*request.resource_spans, *request.resource_spans])

    once, again, merged = map_spans(request), map_spans(request), map_spans(doubled)

    assert once.events == again.events == merged.events
    assert merged.duplicate_spans == 2
    assert {event["data"]["attempt"] for event in once.events} == {2}


def test_otlp_json_and_protobuf_map_to_the_same_events() -> None:
    backend = Backend(**{"fairmeter.customer.id": "cust-7"})
    with backend.baggage(**{"fairmeter.run.id": "run-45"}), backend.agent() as agent:
        backend.chat(input_tokens=1200, output_tokens=300)
        with backend.tool("call_1"):
            pass
        # a span linking to another: links carry hex ids in OTLP/JSON too
        backend.tracer.start_span("retry", links=[Link(agent.get_span_context())]).end()
    request = backend.export()

    from_json = decode_otlp_json(otlp_json(request))

    assert from_json == request
    assert map_spans(from_json).events == map_spans(request).events
    assert_ingest_accepts(map_spans(from_json))


def test_otlp_json_reads_hex_ids_in_either_case_as_the_specification_examples_write_them() -> None:
    body = {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [{"key": "service.name", "value": {"stringValue": "svc"}}]
                },
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "traceId": "5B8EFFF798038103D269B633813FC60C",
                                "spanId": "EEE19B7EC3C1B174",
                                "parentSpanId": "",
                                "name": "invoke_agent",
                                "kind": 1,
                                "endTimeUnixNano": "1544712661000000000",
                                "futureField": True,
                            }
                        ]
                    }
                ],
            }
        ]
    }

    request = decode_otlp_json(json.dumps(body).encode())

    span = request.resource_spans[0].scope_spans[0].spans[0]
    assert span.trace_id.hex() == "5b8efff798038103d269b633813fc60c"
    assert span.span_id.hex() == "eee19b7ec3c1b174"
    assert span.end_time_unix_nano == 1544712661000000000


@pytest.mark.parametrize(
    ("trace_id", "problem"),
    [("5B8EFFF798038103D269B633813FC6", "32 hex digits"), ("W5uNzAe6Tv+ZHsgo2J+Pmw==", "hex")],
)
def test_otlp_json_refuses_an_id_that_is_not_hex_of_its_length_by_its_path(
    trace_id: str, problem: str
) -> None:
    body = {"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": trace_id}]}]}]}

    with pytest.raises(MeteringError) as refused:
        decode_otlp_json(json.dumps(body).encode())

    assert refused.value.status == 422
    [error] = refused.value.errors
    assert error.path == "$.resourceSpans[0].scopeSpans[0].spans[0].traceId"
    assert (error.code, problem in error.message) == ("invalid_id", True)


def test_otlp_json_refuses_a_body_that_is_not_a_trace_export() -> None:
    with pytest.raises(MeteringError) as refused:
        decode_otlp_json(b'{"resourceSpans": "no"}')

    assert (refused.value.status, refused.value.code) == (400, "invalid_otlp")


@pytest.mark.parametrize(
    ("error_type", "cause"),
    [
        ("timeout", "network"),
        ("APITimeoutError", "network"),
        ("httpx.ConnectError", "network"),
        ("java.net.UnknownHostException", "network"),
        ("500", "provider"),
        ("529", "provider"),
        ("InternalServerError", "provider"),
        ("anthropic.OverloadedError", "provider"),
        ("ServiceUnavailableError", "provider"),
        ("ToolExecutionError", "tool"),
        ("ToolTimeoutError", "tool"),
        ("_OTHER", "unknown"),
        ("ValueError", "unknown"),
        ("404", "unknown"),
        (None, "unknown"),
    ],
)
def test_error_type_maps_onto_a_cause_the_catalogue_takes(
    error_type: str | None, cause: str
) -> None:
    assert failure_cause(error_type) == cause


def test_every_cause_the_mapping_can_give_is_one_the_catalogue_takes() -> None:
    causes = {cause for cause, _ in FAILURE_CAUSES} | {"provider", "unknown"}

    assert causes <= set(EVENT_TYPES["run.failed"]["cause"].choices)


def test_otlp_json_refuses_a_body_nested_too_deep_to_decode_as_bad_input() -> None:
    with pytest.raises(MeteringError) as refused:
        decode_otlp_json(b"[" * 100_000 + b"]" * 100_000)

    assert (refused.value.status, refused.value.code) == (400, "invalid_json")


@pytest.mark.parametrize(
    ("attribute", "value", "reason"),
    [
        ("gen_ai.response.model", "m" * 256, "gen_ai.response.model must be 1 to 255 characters"),
        ("gen_ai.response.model", "agent\x00large", "gen_ai.response.model holds U+0000"),
        ("gen_ai.tool.call.id", "call\x00", "gen_ai.tool.call.id holds U+0000"),
    ],
)
def test_a_text_ingest_could_not_store_rejects_the_span_not_the_whole_batch(
    attribute: str, value: str, reason: str
) -> None:
    """Ingest refuses a whole batch for one such event; here only its span is refused."""
    backend = Backend(**{"enduser.id": "cust-7"})
    with backend.agent():
        backend.chat(input_tokens=10, output_tokens=1, **{attribute: value})

    mapped = map_spans(backend.export())

    assert types_of(mapped) == ["run.completed"]
    assert reason in mapped.rejected[0].reason
    assert_ingest_accepts(mapped)


@pytest.mark.timeout(10)
def test_spans_whose_parents_form_a_cycle_are_mapped_without_hanging() -> None:
    """Parent ids are the sender's word: a request may make two spans each other's parent."""

    def span(span_id: int, parent_id: int, **attributes: str | int) -> ProtoSpan:
        return ProtoSpan(
            trace_id=bytes(range(16)),
            span_id=span_id.to_bytes(8, "big"),
            parent_span_id=parent_id.to_bytes(8, "big"),
            end_time_unix_nano=1,
            attributes=[
                KeyValue(
                    key=key,
                    value=AnyValue(int_value=value)
                    if isinstance(value, int)
                    else AnyValue(string_value=value),
                )
                for key, value in attributes.items()
            ],
        )

    chat = {"gen_ai.request.model": "m", "gen_ai.usage.input_tokens": 1}
    spans = [
        span(1, 2, **{"http.route": "/a"}),
        span(2, 1, **{"http.route": "/b"}),
        span(3, 1, **{"gen_ai.operation.name": "invoke_agent"}),
        span(4, 2, **{"gen_ai.operation.name": "chat", **chat}),
    ]
    customer = KeyValue(key="enduser.id", value=AnyValue(string_value="cust-7"))
    request = ExportTraceServiceRequest(
        resource_spans=[
            ResourceSpans(
                resource=Resource_(attributes=[customer]), scope_spans=[ScopeSpans(spans=spans)]
            )
        ]
    )

    mapped = map_spans(request)

    assert sorted(types_of(mapped)) == ["run.completed", "run.usage"]


def _two_runs() -> ExportTraceServiceRequest:
    backend = Backend(**{"enduser.id": "cust-7"})
    for run in ("run-a", "run-b"):
        with backend.baggage(**{"fairmeter.run.id": run}), backend.agent():
            backend.chat(input_tokens=100, output_tokens=10)
            with backend.tool(f"call-{run}"):
                backend.chat(input_tokens=50, output_tokens=5)
            backend.chat(input_tokens=70, output_tokens=7)
    return backend.export()


TWO_RUNS = _two_runs()
SPAN_COUNT = len(TWO_RUNS.resource_spans[0].scope_spans[0].spans)


@given(order=st.permutations(range(SPAN_COUNT)))
def test_the_events_do_not_depend_on_the_order_of_spans_in_the_request(order: list[int]) -> None:
    """Exporters and collectors batch and order spans as they please; same spans, same bill."""
    [resource_spans] = TWO_RUNS.resource_spans
    spans = list(resource_spans.scope_spans[0].spans)
    shuffled = ExportTraceServiceRequest()
    shuffled.resource_spans.add(resource=resource_spans.resource).scope_spans.add(
        spans=[spans[i] for i in order]
    )

    assert SPAN_COUNT == 10
    assert map_spans(shuffled).events == map_spans(TWO_RUNS).events
