"""POST /v1/traces reads every member of a gzip body (RFC 1952 §2.2: a gzip file is a series
of members), all members together within the one inflation limit, and refuses bytes after a
member that are not one: before issue #30 only the first member was read and the rest's
spans went unbilled behind a 200 without ``partial_success``."""

from __future__ import annotations

import gzip
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from metering.settlement.runner import settle_due_now
from tests.helpers.events import auth
from tests.helpers.otlp import Backend

GZIP_PROTOBUF = {"content-type": "application/x-protobuf", "content-encoding": "gzip"}
CUSTOMER = {"fairmeter.customer.id": "cust-gzip"}
# agent-large-1 at 3 / 15 USD per million tokens (tests/helpers/prices.csv)
ONE_CALL_MICROS = 1_000 * 3 + 200 * 15


def run_export(run: str) -> bytes:
    """A serialized export of one traced run: an agent making one priced model call."""
    agent = Backend(response_model="agent-large-1")
    with agent.baggage(**{"fairmeter.run.id": run, **CUSTOMER}), agent.agent():
        agent.chat(input_tokens=1_000, output_tokens=200)
    return bytes(agent.export().SerializeToString())


def post(client: Any, key: str, body: bytes) -> Any:
    return client.post("/v1/traces", content=body, headers=auth(key, **GZIP_PROTOBUF))


def billed(client: Any, make_key: Any, engine: Any, settings: Any, run: str) -> int:
    """What ``run`` was billed once every due run settled (its grace period passed)."""
    settle_due_now(engine, settings, now=datetime.now(UTC) + timedelta(hours=1))
    reply = client.get(f"/v1/runs/{run}", headers=auth(make_key(scope="support")))
    assert reply.status_code == 200, reply.text
    return int(reply.json()["billed_micros"])


def refusal(reply: Any) -> str:
    """The google.rpc.Status message of an OTLP error (the request was protobuf)."""
    assert reply.headers["content-type"] == "application/x-protobuf"
    return str(Status.FromString(reply.content).message)


def stored_events(db: Any) -> int:
    return int(db.execute("SELECT count(*) FROM events").fetchone()[0])


def test_two_runs_in_two_gzip_members_are_both_stored_and_billed(
    client, make_key, db, engine, settings
):
    """Protobuf messages concatenated are one message (repeated fields append), so a
    collector that gzips each batch as a member and concatenates them sends both runs."""
    body = gzip.compress(run_export("gz-run-1")) + gzip.compress(run_export("gz-run-2"))

    reply = post(client, make_key(scope="ingest"), body)

    assert reply.status_code == 200, reply.text
    assert not ExportTraceServiceResponse.FromString(reply.content).HasField("partial_success")
    assert billed(client, make_key, engine, settings, "gz-run-1") == ONE_CALL_MICROS
    assert billed(client, make_key, engine, settings, "gz-run-2") == ONE_CALL_MICROS


def test_one_export_split_across_gzip_members_is_read_whole(client, make_key, db):
    export = run_export("gz-run-3")
    cut = len(export) // 3
    members = [export[:cut], export[cut : 2 * cut], b"", export[2 * cut :]]  # an empty one too

    reply = post(client, make_key(scope="ingest"), b"".join(map(gzip.compress, members)))

    assert reply.status_code == 200, reply.text
    assert stored_events(db) == 2  # the model call and the run's end


@pytest.mark.parametrize(
    ("members", "inflating_to"),
    [
        (2, 9 * 1024 * 1024),  # each member under 16 MiB, the two together over it
        (4_000, 64 * 1024),  # a member bomb: ~400 KB that would inflate to 250 MiB
    ],
)
def test_gzip_members_inflating_past_the_limit_together_are_a_413(
    client, make_key, db, members, inflating_to
):
    body = gzip.compress(b"\0" * inflating_to) * members
    assert len(body) < 1024 * 1024  # under the body limit: only the inflation is refused

    reply = post(client, make_key(scope="ingest"), body)

    assert reply.status_code == 413, reply.text
    assert refusal(reply).startswith("payload_too_large: ")
    assert stored_events(db) == 0


@pytest.mark.parametrize(
    "trailer",
    [b"garbage", b"\0\0\0\0", b"\x1f\x8b\x08\0 truncated member"],
)
def test_bytes_after_a_gzip_member_that_are_not_a_member_are_a_400(client, make_key, db, trailer):
    body = gzip.compress(run_export("gz-run-4")) + trailer

    reply = post(client, make_key(scope="ingest"), body)

    assert reply.status_code == 400, reply.text
    assert refusal(reply).startswith("invalid_gzip: ")
    assert stored_events(db) == 0
