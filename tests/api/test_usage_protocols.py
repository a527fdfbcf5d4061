"""One model call sent as a CloudEvent and as an OTLP span is charged once (issue #30;
docs/otlp.md, "One path per run"): a run's usage comes through the protocol that brought
its first usage, usage through the other one is refused clearly, and lifecycle events are
taken through either. Against the served API, so two first usages really race."""

from __future__ import annotations

import json
import secrets
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from metering.settlement.runner import settle_due_now
from tests.helpers.events import BATCH, auth, event, usage

CUSTOMER = "cust-dual"
# agent-large-1 at 3 / 15 USD per million tokens (tests/helpers/prices.csv)
INPUT_TOKENS, OUTPUT_TOKENS = 1000, 100
ONE_CALL_MICROS = INPUT_TOKENS * 3 + OUTPUT_TOKENS * 15
OTLP_JSON = {"content-type": "application/json"}


@pytest.fixture
def key(make_key: Any) -> str:
    return make_key(tenant="acme", scope="ingest")


def _attributes(run: str, operation: str, **extra: Any) -> list[dict[str, Any]]:
    values = {
        "gen_ai.operation.name": {"stringValue": operation},
        "fairmeter.run.id": {"stringValue": run},
        "fairmeter.customer.id": {"stringValue": CUSTOMER},
        **extra,
    }
    return [{"key": name, "value": value} for name, value in values.items()]


def otlp_export(run: str, *, agent_span: bool = False) -> bytes:
    """OTLP/JSON of one model call of ``run`` (the call ``model_call`` sends as a CloudEvent),
    inside an invoke_agent span that ended the run when ``agent_span``."""
    trace_id, agent_id, chat_id = secrets.token_hex(16), secrets.token_hex(8), secrets.token_hex(8)
    end_ns = time.time_ns() - 1_000_000_000
    chat = {
        "traceId": trace_id,
        "spanId": chat_id,
        "name": "chat agent-large-1",
        "kind": 3,
        "startTimeUnixNano": str(end_ns - 600_000_000),
        "endTimeUnixNano": str(end_ns - 100_000_000),
        "attributes": _attributes(
            run,
            "chat",
            **{
                "gen_ai.request.model": {"stringValue": "agent-large-1"},
                "gen_ai.usage.input_tokens": {"intValue": str(INPUT_TOKENS)},
                "gen_ai.usage.output_tokens": {"intValue": str(OUTPUT_TOKENS)},
            },
        ),
    }
    spans = [chat]
    if agent_span:
        chat["parentSpanId"] = agent_id
        agent = {
            "traceId": trace_id,
            "spanId": agent_id,
            "name": "invoke_agent support-bot",
            "startTimeUnixNano": str(end_ns - 900_000_000),
            "endTimeUnixNano": str(end_ns),
            "attributes": _attributes(run, "invoke_agent"),
        }
        spans.append(agent)
    service = {"key": "service.name", "value": {"stringValue": "support-agent"}}
    document = {
        "resourceSpans": [{"resource": {"attributes": [service]}, "scopeSpans": [{"spans": spans}]}]
    }
    return json.dumps(document).encode()


def model_call(run: str) -> dict[str, Any]:
    return usage(
        run=run,
        customer=CUSTOMER,
        model="agent-large-1",
        input_tokens=INPUT_TOKENS,
        output_tokens=OUTPUT_TOKENS,
    )


def send_events(base: str, key: str, events: list[dict[str, Any]]) -> httpx.Response:
    return httpx.post(
        f"{base}/v1/events", headers=auth(key, **BATCH), content=json.dumps(events), timeout=30
    )


def send_spans(base: str, key: str, body: bytes) -> httpx.Response:
    return httpx.post(f"{base}/v1/traces", headers=auth(key, **OTLP_JSON), content=body, timeout=30)


def partial_success(reply: httpx.Response) -> dict[str, Any]:
    assert reply.status_code == 200, reply.text
    found: dict[str, Any] = reply.json().get("partialSuccess", {})
    return found


def settled_run(base: str, make_key: Any, run: str, engine: Any, settings: Any) -> dict[str, Any]:
    settle_due_now(engine, settings, now=datetime.now(UTC) + timedelta(hours=1))
    reply = httpx.get(f"{base}/v1/runs/{run}", headers=auth(make_key(scope="support")), timeout=10)
    assert reply.status_code == 200, reply.text
    run_document: dict[str, Any] = reply.json()
    return run_document


def usage_sources(db: Any, run: str) -> list[str]:
    rows = db.execute(
        "SELECT e.source FROM usage_lines u JOIN events e ON e.id = u.event_pk "
        "JOIN runs r ON r.id = u.run_id WHERE r.subject = %s",
        (run,),
    ).fetchall()
    return sorted(row[0] for row in rows)


def test_a_call_sent_as_a_cloudevent_then_as_a_span_is_refused_and_charged_once(
    live_server, key, make_key, db, engine, settings
):
    run = "dual-ce-first"
    first = send_events(live_server, key, [event(type="run.started", run=run, customer=CUSTOMER)])
    assert first.status_code == 200, first.text
    assert send_events(live_server, key, [model_call(run)]).json()["accepted"] == 1

    refused = partial_success(send_spans(live_server, key, otlp_export(run, agent_span=True)))

    # the span's usage is refused, naming the run and the rule; the agent span's end is not
    assert refused["rejectedSpans"] == "1"  # int64: a string in OTLP/JSON
    message = refused["errorMessage"]
    assert message.startswith("1 span(s) rejected: event ")
    assert f"run {run}'s usage came through CloudEvents, POST /v1/events first" in message
    assert "usage_protocol_conflict" in message
    shown = settled_run(live_server, make_key, run, engine, settings)
    assert shown["event_counts"] == {"run.started": 1, "run.usage": 1, "run.completed": 1}
    assert shown["usage_protocol"] == "cloudevents"
    assert (shown["outcome"], shown["billed_micros"]) == ("confirmed", ONE_CALL_MICROS)
    assert usage_sources(db, run) == ["agent-backend/eu-1"]


def test_a_call_sent_as_a_span_then_as_a_cloudevent_is_a_422_and_charged_once(
    live_server, key, make_key, db, engine, settings
):
    run = "dual-otlp-first"
    assert partial_success(send_spans(live_server, key, otlp_export(run))) == {}

    lifecycle = event(
        type="run.tool_call",
        run=run,
        customer=CUSTOMER,
        step=1,
        tool_call_id="call-1",
        status="completed",
    )
    reply = send_events(live_server, key, [lifecycle, model_call(run)])

    assert reply.status_code == 422, reply.text
    problem = reply.json()
    assert problem["code"] == "usage_protocol_conflict"
    [error] = problem["errors"]
    assert (error["path"], error["code"]) == ("$[1].subject", "usage_protocol_conflict")
    assert f"run {run}'s usage came through OTLP, POST /v1/traces first" in error["message"]
    # lifecycle alone is taken through CloudEvents: only usage is one protocol's
    ended = event(type="run.completed", run=run, customer=CUSTOMER)
    assert send_events(live_server, key, [lifecycle, ended]).json()["accepted"] == 2
    shown = settled_run(live_server, make_key, run, engine, settings)
    assert shown["usage_protocol"] == "otlp"
    assert (shown["outcome"], shown["billed_micros"]) == ("confirmed", ONE_CALL_MICROS)
    assert usage_sources(db, run) == ["otlp/support-agent"]


def _race(base: str, key: str, run: str) -> tuple[httpx.Response, httpx.Response]:
    """A run's first usage through both protocols at the same moment, from two threads."""
    start = threading.Barrier(2)
    replies: dict[str, httpx.Response] = {}

    def send(protocol: str) -> None:
        start.wait()
        if protocol == "cloudevents":
            replies[protocol] = send_events(base, key, [model_call(run)])
        else:
            replies[protocol] = send_spans(base, key, otlp_export(run))

    threads = [threading.Thread(target=send, args=(p,)) for p in ("cloudevents", "otlp")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return replies["cloudevents"], replies["otlp"]


def test_concurrent_first_usages_through_both_protocols_leave_exactly_one_winner(
    live_server, key, db
):
    for round_ in range(8):
        run = f"dual-race-{round_}"
        as_event, as_span = _race(live_server, key, run)
        event_won = as_event.status_code == 200
        span_won = partial_success(as_span) == {}
        assert event_won != span_won, (as_event.text, as_span.text)
        if event_won:
            assert "usage_protocol_conflict" in partial_success(as_span)["errorMessage"]
        else:
            assert as_event.status_code == 422 and as_event.json()["code"] == (
                "usage_protocol_conflict"
            )
        stored = db.execute("SELECT usage_protocol FROM runs WHERE subject = %s", (run,))
        assert stored.fetchone()[0] == ("cloudevents" if event_won else "otlp")
        assert len(usage_sources(db, run)) == 1
