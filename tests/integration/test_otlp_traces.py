"""POST /v1/traces with the real OpenTelemetry SDK and its real OTLP/HTTP exporter against
the real server (issue #19; docs/otlp.md): traced agent runs are stored, settled and worded
like runs sent as CloudEvents, and a retried export is never a second charge."""

from __future__ import annotations

import gzip
import threading
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from google.rpc.status_pb2 import Status
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.trace.export import SpanExportResult

from metering.settlement.runner import settle_due_now
from tests.helpers.otlp import Backend, InternalServerError, otlp_json

CUSTOMER = {"fairmeter.customer.id": "cust-otel"}
PROTOBUF = {"content-type": "application/x-protobuf"}


@pytest.fixture
def key(make_key: Any) -> str:
    return make_key(tenant="acme", scope="ingest")


def exporter(base: str, key: str, **options: Any) -> OTLPSpanExporter:
    """The exporter as a backend configures it: the endpoint and the key in its headers."""
    return OTLPSpanExporter(
        endpoint=f"{base}/v1/traces",
        headers={"authorization": f"Bearer {key}"},
        timeout=10,
        **options,
    )


def backend(base: str, key: str, **options: Any) -> Backend:
    """A backend whose spans go to the server in batches; the model answering is priced."""
    return Backend(sends_to=exporter(base, key, **options), response_model="agent-large-1")


def traced_run(agent: Backend, run: str, *, tool_calls: tuple[str, ...] = ("call-1",)) -> None:
    """An agent run: a model call, tool calls (each making a model call), a last model call."""
    with agent.baggage(**{"fairmeter.run.id": run, **CUSTOMER}), agent.agent():
        agent.chat(input_tokens=1200, output_tokens=300)
        for call in tool_calls:
            with agent.tool(call):
                agent.chat(input_tokens=400, output_tokens=50)
        agent.chat(input_tokens=1500, output_tokens=80)
    agent.flush()


def settled(base: str, make_key: Any, run: str, engine: Any, settings: Any) -> dict[str, Any]:
    """Settle every due run (the grace period passed), then the run as support sees it."""
    settle_due_now(engine, settings, now=datetime.now(UTC) + timedelta(hours=1))
    reply = httpx.get(
        f"{base}/v1/runs/{run}",
        headers={"authorization": f"Bearer {make_key(scope='support')}"},
        timeout=10,
    )
    assert reply.status_code == 200, reply.text
    return reply.json()


def counts(db: Any) -> tuple[int, int]:
    events = db.execute("SELECT count(*) FROM events").fetchone()[0]
    lines = db.execute("SELECT count(*) FROM usage_lines").fetchone()[0]
    return events, lines


def post(base: str, key: str | None, headers: dict[str, str], body: bytes) -> httpx.Response:
    auth = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{base}/v1/traces", headers={**headers, **auth}, content=body, timeout=10)


def test_a_traced_agent_run_is_stored_and_settles_completed(
    live_server, key, make_key, db, engine, settings
):
    traced_run(backend(live_server, key), "otel-run-1")

    rows = db.execute(
        "SELECT type, source FROM events WHERE attributes->>'subject' = 'otel-run-1' ORDER BY time"
    ).fetchall()
    assert [row[0] for row in rows] == [
        "run.usage",
        "run.usage",
        "run.tool_call",
        "run.usage",
        "run.completed",
    ]
    assert {row[1] for row in rows} == {"otlp/support-agent"}
    run = settled(live_server, make_key, "otel-run-1", engine, settings)
    assert (run["outcome"], run["status"]) == ("confirmed", "Completed")
    # agent-large-1 at 3 / 15 USD per million tokens: 3,100 input and 430 output tokens
    assert run["billed_micros"] == 3_100 * 3 + 430 * 15


def test_a_run_failed_by_a_provider_error_is_refunded(
    live_server, key, make_key, db, engine, settings
):
    agent = backend(live_server, key)
    with (
        agent.baggage(**{"fairmeter.run.id": "otel-run-2", **CUSTOMER}),
        pytest.raises(InternalServerError),
        agent.agent(),
    ):
        agent.chat(input_tokens=900, output_tokens=40)
        raise InternalServerError("503 from the provider")
    agent.flush()

    run = settled(live_server, make_key, "otel-run-2", engine, settings)
    assert run["outcome"] == "refunded"
    assert run["status"] == "Run failed — usage restored"
    assert run["billed_micros"] == 0


def test_a_tool_call_made_twice_is_credited_and_gzip_bodies_are_read(
    live_server, key, make_key, db, engine, settings
):
    agent = backend(live_server, key, compression=Compression.Gzip)
    traced_run(agent, "otel-run-3", tool_calls=("call-1", "call-1"))

    run = settled(live_server, make_key, "otel-run-3", engine, settings)
    assert run["outcome"] == "partially_credited", run
    assert run["status"] == "Completed — duplicate work credited"
    assert "R1" in run["rule_ids"]
    assert run["credited_micros"] == 400 * 3 + 50 * 15  # the model call of the second call


def test_exporting_the_same_spans_again_stores_nothing_twice(live_server, key, db):
    agent = backend(live_server, key)
    traced_run(agent, "otel-run-4")
    before = counts(db)
    assert before == (5, 3)

    again = exporter(live_server, key).export(agent.finished_spans())

    assert again == SpanExportResult.SUCCESS
    assert counts(db) == before


def test_a_json_export_maps_as_the_protobuf_one(live_server, key, db):
    """The same spans as OTLP/JSON (hex ids), then as protobuf: the second stores nothing,
    so both mapped to the same events with the same content (else: a 409 conflict)."""
    agent = Backend(response_model="agent-large-1")
    traced_run(agent, "otel-run-5")

    reply = post(live_server, key, {"content-type": "application/json"}, otlp_json(agent.export()))

    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"].startswith("application/json")
    assert reply.json() == {}  # no partial_success: every span accepted
    assert counts(db) == (5, 3)
    again = exporter(live_server, key).export(agent.finished_spans())
    assert again == SpanExportResult.SUCCESS
    assert counts(db) == (5, 3)


def test_a_span_without_customer_is_rejected_in_partial_success_and_the_rest_stored(
    live_server, key, db
):
    agent = Backend(response_model="agent-large-1")
    with agent.baggage(**{"fairmeter.run.id": "otel-run-6", **CUSTOMER}), agent.agent():
        agent.chat(input_tokens=100, output_tokens=10)
    agent.chat(input_tokens=100, output_tokens=10)  # outside the run: no customer
    rejected_before = rejected_spans(live_server)

    reply = post(live_server, key, PROTOBUF, agent.export().SerializeToString())

    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"] == "application/x-protobuf"
    answer = ExportTraceServiceResponse.FromString(reply.content)
    assert answer.partial_success.rejected_spans == 1
    assert "no customer" in answer.partial_success.error_message
    assert "chat agent-large-1" in answer.partial_success.error_message
    assert counts(db) == (2, 1)  # the run's model call and its end
    assert rejected_spans(live_server) == rejected_before + 1


def rejected_spans(base: str) -> float:
    """fairmeter_otlp_spans_total{result="rejected",reason="unmappable"}, summed over workers."""
    text = httpx.get(f"{base}/metrics", timeout=10).text
    prefix = 'fairmeter_otlp_spans_total{reason="unmappable",result="rejected"}'
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix)
    )


def test_a_run_resent_with_other_content_is_refused_and_the_other_runs_stored(live_server, key, db):
    """A collector that re-batches a run differently can give one of its events other
    content: ingest refuses that as a conflict (never a second charge). In an export, only
    that run's spans are refused; another run in the same export is stored."""
    first = Backend(response_model="agent-large-1")
    traced_run(first, "otel-run-9", tool_calls=())
    assert post(live_server, key, PROTOBUF, first.export().SerializeToString()).status_code == 200
    changed = first.export()
    for attribute in changed.resource_spans[0].scope_spans[0].spans[0].attributes:
        if attribute.key == "gen_ai.usage.input_tokens":
            attribute.value.int_value += 1
    other = Backend(response_model="agent-large-1")
    traced_run(other, "otel-run-10", tool_calls=())
    changed.resource_spans.extend(other.export().resource_spans)

    reply = post(live_server, key, PROTOBUF, changed.SerializeToString())

    assert reply.status_code == 200, reply.text
    partial = ExportTraceServiceResponse.FromString(reply.content).partial_success
    assert partial.rejected_spans == 3  # otel-run-9's two model calls and its end
    assert "event_conflict" in partial.error_message
    assert "otel-run-9" in partial.error_message
    runs = db.execute(
        "SELECT attributes->>'subject', count(*) FROM events GROUP BY 1 ORDER BY 1"
    ).fetchall()
    assert [tuple(row) for row in runs] == [("otel-run-10", 3), ("otel-run-9", 3)]


def test_an_event_ingest_refuses_rejects_its_span_only(live_server, key, db):
    """A model without a price is ingest's refusal (422 for a CloudEvents batch); in an
    export it refuses that span, named in partial_success (JSON here), and no other."""
    agent = Backend(response_model="model-without-a-price")
    with agent.baggage(**{"fairmeter.run.id": "otel-run-7", **CUSTOMER}), agent.agent():
        agent.chat(input_tokens=100, output_tokens=10)

    reply = post(live_server, key, {"content-type": "application/json"}, otlp_json(agent.export()))

    assert reply.status_code == 200, reply.text
    partial = reply.json()["partialSuccess"]
    assert int(partial["rejectedSpans"]) == 1
    assert "data.model" in partial["errorMessage"]
    assert "model-without-a-price" in partial["errorMessage"]
    assert counts(db) == (1, 0)  # the run's end


@pytest.mark.parametrize(
    ("headers", "body", "status", "code"),
    [
        ({"content-type": "text/plain"}, b"spans", 415, "unsupported_media_type"),
        ({"content-type": "application/x-protobuf"}, b"not a protobuf", 400, "invalid_otlp"),
        ({"content-type": "application/json"}, b"{not json", 400, "invalid_json"),
        (
            {"content-type": "application/x-protobuf", "content-encoding": "gzip"},
            b"not gzip",
            400,
            "invalid_gzip",
        ),
        (
            {"content-type": "application/x-protobuf"},
            b"\0" * (1024 * 1024 + 1),  # over the body limit (1 MiB)
            413,
            "payload_too_large",
        ),
        (
            {"content-type": "application/x-protobuf", "content-encoding": "gzip"},
            gzip.compress(b"\0" * (16 * 1024 * 1024 + 1)),  # inflates past 16 × the limit
            413,
            "payload_too_large",
        ),
        (
            {"content-type": "application/x-protobuf", "content-encoding": "br"},
            gzip.compress(b""),
            415,
            "unsupported_media_type",
        ),
    ],
)
def test_a_body_that_cannot_be_read_is_a_4xx_exporters_do_not_retry(
    live_server, key, db, headers, body, status, code
):
    reply = post(live_server, key, headers, body)
    assert reply.status_code == status, reply.text
    assert status_text(reply).startswith(f"{code}: ")
    assert counts(db) == (0, 0)


def status_text(reply: httpx.Response) -> str:
    """The message of the google.rpc.Status an OTLP/HTTP error carries, in the request's
    encoding (JSON for a request in neither)."""
    if reply.headers["content-type"] == "application/x-protobuf":
        return Status.FromString(reply.content).message
    assert reply.headers["content-type"].startswith("application/json")
    return str(reply.json()["message"])


def test_keys_are_those_of_ingest(live_server, make_key, db):
    body = Backend().export().SerializeToString()
    for key, status, code in (
        (None, 401, "unauthenticated"),
        ("fm_wrong", 401, "unauthenticated"),
        (make_key(scope="support"), 403, "forbidden"),
    ):
        reply = post(live_server, key, PROTOBUF, body)
        assert reply.status_code == status, reply.text
        assert status_text(reply).startswith(f"{code}: ")


def test_a_tenants_spans_are_its_own(live_server, make_key, db, engine):
    """The same spans sent with two tenants' keys are two tenants' events, each stored."""
    agent = Backend(response_model="agent-large-1")
    traced_run(agent, "otel-run-8")
    body = agent.export().SerializeToString()
    for tenant in ("tenant-a", "tenant-b"):
        reply = post(live_server, make_key(tenant=tenant), PROTOBUF, body)
        assert reply.status_code == 200, reply.text
        assert ExportTraceServiceResponse.FromString(reply.content).ByteSize() == 0
    rows = db.execute("SELECT tenant_id, count(*) FROM events GROUP BY 1 ORDER BY 1").fetchall()
    assert [tuple(row) for row in rows] == [("tenant-a", 5), ("tenant-b", 5)]


def test_an_unreachable_database_is_a_503_the_exporter_retries(settings, make_key, db):
    """Never a 500: exporters retry a 503 after Retry-After (OTLP/HTTP), and drop a 500."""
    from litestar.testing import TestClient

    from api.app import create_app

    key = make_key()
    broken = settings.model_copy(update={"database_url": "postgresql://postgres@127.0.0.1:1/x"})
    body = Backend(response_model="agent-large-1").export().SerializeToString()
    with TestClient(app=create_app(broken)) as client:
        reply = client.post(
            "/v1/traces", content=body, headers={**PROTOBUF, "authorization": f"Bearer {key}"}
        )
    assert reply.status_code == 503
    assert reply.headers["retry-after"] == "5"
    assert Status.FromString(reply.content).message.startswith("database_unavailable: ")


def test_a_database_lost_after_the_key_was_checked_is_a_503_and_nothing_half_stored(
    settings, make_key, db
):
    """The store's own failure, not the key lookup's: the key and prices are cached, then the
    API's engine and group committer point at a database that does not answer."""
    from litestar.testing import TestClient

    from api.app import create_app
    from api.ingest_group import GroupCommitter
    from metering.db import create_db_engine

    key = make_key()
    headers = {**PROTOBUF, "authorization": f"Bearer {key}"}
    first, second = (Backend(response_model="agent-large-1") for _ in range(2))
    traced_run(first, "otel-run-11")
    traced_run(second, "otel-run-12")
    broken = settings.model_copy(update={"database_url": "postgresql://postgres@127.0.0.1:1/x"})
    with TestClient(app=create_app(settings)) as client:
        stored = client.post(
            "/v1/traces", content=first.export().SerializeToString(), headers=headers
        )
        assert stored.status_code == 200, stored.text
        services = client.app.state.services
        services.engine = create_db_engine(broken)
        services.ingest_group = GroupCommitter(services.engine, max_events=1000, max_flushes=1)

        reply = client.post(
            "/v1/traces", content=second.export().SerializeToString(), headers=headers
        )

    assert reply.status_code == 503, reply.text
    assert reply.headers["retry-after"] == "5"
    assert Status.FromString(reply.content).message.startswith("database_unavailable: ")
    assert counts(db) == (5, 3)  # the first export's run, nothing of the second


def test_connection_telemetry_sent_as_cloudevents_joins_the_traced_run(
    live_server, key, make_key, db, engine, settings
):
    """The gateway still reports connection loss as CloudEvents; the policy sees them with
    the spans of the same run. A run failed for a reason the trace cannot place (cause
    unknown) is held for review alone; with the gateway's server-side drop before it, it is
    a verified interruption and refunded (R4), citing the CloudEvent."""
    agent = backend(live_server, key)
    for run in ("otel-mixed-held", "otel-mixed-dropped"):
        with (
            agent.baggage(**{"fairmeter.run.id": run, **CUSTOMER}),
            pytest.raises(LookupError),
            agent.agent(),
        ):
            agent.chat(input_tokens=900, output_tokens=40)
            if run == "otel-mixed-dropped":
                lost = {
                    "specversion": "1.0",
                    "id": "gw-drop-1",
                    "source": "gateway/eu-1",
                    "type": "connection.lost",
                    "subject": run,
                    "time": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
                    "data": {"customer": CUSTOMER["fairmeter.customer.id"], "side": "server"},
                }
                sent = httpx.post(
                    f"{live_server}/v1/events",
                    headers={
                        "authorization": f"Bearer {key}",
                        "content-type": "application/cloudevents+json",
                    },
                    json=lost,
                    timeout=10,
                )
                assert sent.status_code in (200, 202), sent.text
            raise LookupError("no idea what failed")
        agent.flush()

    held = settled(live_server, make_key, "otel-mixed-held", engine, settings)
    assert held["outcome"] == "held_for_review", held
    dropped = settled(live_server, make_key, "otel-mixed-dropped", engine, settings)
    assert dropped["outcome"] == "refunded", dropped
    assert "R4" in dropped["rule_ids"]
    (evidence,) = db.execute(
        "SELECT d.evidence_event_ids FROM decisions d JOIN runs r ON r.id = d.run_id "
        "WHERE r.subject = 'otel-mixed-dropped' ORDER BY d.version DESC LIMIT 1"
    ).fetchone()
    assert "gateway/eu-1/gw-drop-1" in evidence


class LosingGateway:
    """A gateway in front of the server that forwards the first export but loses the
    server's reply (a 503 instead, as a gateway timing out sends), then passes the rest."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.requests = 0
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                reply = httpx.post(
                    f"{gateway.upstream}{self.path}", headers=headers, content=body, timeout=10
                )
                gateway.requests += 1
                if gateway.requests == 1:
                    self.send_response(503)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                self.send_response(reply.status_code)
                self.send_header("content-type", reply.headers.get("content-type", ""))
                self.send_header("content-length", str(len(reply.content)))
                self.end_headers()
                self.wfile.write(reply.content)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_the_exporter_retries_a_lost_reply_and_the_run_is_charged_once(
    live_server, key, make_key, db, engine, settings
):
    gateway = LosingGateway(live_server)
    try:
        traced_run(backend(gateway.url, key), "otel-retried")
    finally:
        gateway.close()
    assert gateway.requests == 2, "the exporter did not retry the export whose reply was lost"
    once = backend(live_server, key)
    traced_run(once, "otel-once")
    stored = db.execute(
        "SELECT r.subject, count(*) FROM usage_lines u JOIN runs r ON r.id = u.run_id "
        "WHERE r.subject IN ('otel-retried', 'otel-once') GROUP BY 1 ORDER BY 1"
    ).fetchall()
    assert stored == [("otel-once", 3), ("otel-retried", 3)]
    retried = settled(live_server, make_key, "otel-retried", engine, settings)
    single = settled(live_server, make_key, "otel-once", engine, settings)
    assert retried["billed_micros"] == single["billed_micros"] > 0
