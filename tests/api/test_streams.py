"""GET /v1/runs/{run}/stream and /v1/customers/{customer}/stream in-process: who may open
which stream, what is refused before a stream starts, and the frames of a short stream.

A stream never ends by itself while its client stays, so the frames are read here from
streams that end after ``stream_max_s``; the live fan-out between API processes is in
test_streams_served.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from litestar.testing import TestClient

from metering.config import Settings
from metering.db import raw_transaction
from metering.notifications import Notification, record
from tests.helpers.events import BATCH, auth, event
from tests.security.reach import seed_legacy_run, segment

pytestmark = pytest.mark.timeout(120)


def send(client: Any, key: str, *events: dict[str, Any]) -> None:
    reply = client.post("/v1/events", content=json.dumps(list(events)), headers=auth(key, **BATCH))
    assert reply.status_code == 200, reply.text


@pytest.fixture
def two_customers(client: Any, make_key: Any) -> None:
    """Tenant acme: run-a of cust-a and run-b of cust-b; tenant globex: run-g of cust-g."""
    acme = make_key(tenant="acme", scope="ingest")
    send(client, acme, event(type="run.started", run="run-a", customer="cust-a"))
    send(client, acme, event(type="run.started", run="run-b", customer="cust-b"))
    globex = make_key(tenant="globex", scope="ingest")
    send(client, globex, event(type="run.started", run="run-g", customer="cust-g"))


def status(client: Any, path: str, key: str | None, **headers: str) -> tuple[int, Any]:
    reply = client.get(path, headers={**(auth(key) if key else {}), **headers})
    return reply.status_code, reply.json()


@pytest.mark.usefixtures("two_customers")
def test_streams_answer_as_the_reads_they_stand_for_before_anything_streams(client, make_key):
    customer_a = make_key(tenant="acme", scope="customer", customer="cust-a")
    support_globex = make_key(tenant="globex", scope="support")
    ingest = make_key(tenant="acme", scope="ingest")
    refusals = [
        ("/v1/runs/run-a/stream", None, 401, "unauthenticated"),
        ("/v1/runs/run-b/stream", customer_a, 404, "run_not_found"),  # another customer's
        ("/v1/runs/run-a/stream", support_globex, 404, "run_not_found"),  # another tenant's
        ("/v1/runs/run-g/stream", customer_a, 404, "run_not_found"),
        ("/v1/runs/no-such-run/stream", customer_a, 404, "run_not_found"),
        ("/v1/customers/cust-b/stream", customer_a, 404, "customer_not_found"),
        ("/v1/customers/cust-a/stream", support_globex, 404, "customer_not_found"),
        ("/v1/customers/cust-a/stream", ingest, 403, "forbidden"),
        (f"/v1/runs/{'r' * 201}/stream", customer_a, 422, "invalid_id"),
        (f"/v1/customers/{'c' * 129}/stream", customer_a, 422, "invalid_id"),
    ]
    for path, key, code, problem in refusals:
        got, body = status(client, path, key)
        assert (got, body["code"]) == (code, problem), f"{path}: {got} {body}"


@pytest.mark.usefixtures("two_customers")
def test_a_bad_last_event_id_is_a_422_naming_it(client, make_key):
    key = make_key(tenant="acme", scope="support")
    for headers, path in (
        ({"Last-Event-ID": "yesterday"}, "/v1/runs/run-a/stream"),
        ({}, "/v1/customers/cust-a/stream?last_event_id=-4"),
    ):
        code, body = status(client, path, key, **headers)
        assert code == 422 and body["errors"][0]["path"] == "$.last_event_id", body


@contextmanager
def app_with(settings: Settings, **changes: Any) -> Iterator[TestClient[Any]]:
    from api.app import create_app

    with TestClient(app=create_app(settings.model_copy(update=changes))) as client:
        yield client


@pytest.mark.usefixtures("two_customers")
def test_a_full_process_refuses_another_stream_with_503(settings, make_key):
    key = make_key(tenant="acme", scope="support")
    with app_with(settings, stream_max_per_process=0) as full:
        reply = full.get("/v1/runs/run-a/stream", headers=auth(key))
    assert reply.status_code == 503, reply.text
    assert reply.json()["code"] == "too_many_streams"
    assert reply.headers["retry-after"] == "5"


def frames(text: str) -> list[dict[str, str]]:
    """The stream's blocks as {field: value} (comments under ":")."""
    found = []
    for block in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")
        if fields:
            found.append(fields)
    return found


def notify(engine: Any, db: Any, subject: str, customer: str, status: str) -> int:
    run_id = db.execute("SELECT id FROM runs WHERE subject = %s", (subject,)).fetchone()[0]
    with raw_transaction(engine) as conn:
        return record(
            conn,
            Notification(
                "acme", customer, "run.status_changed", {"status": status}, run_id, subject
            ),
        )


@pytest.mark.usefixtures("two_customers")
def test_a_fresh_run_stream_opens_with_the_run_as_it_is_then_ends_after_its_time(
    settings, engine, db: psycopg.Connection[Any], make_key
):
    first = notify(engine, db, "run-a", "cust-a", "Agent still running")
    key = make_key(tenant="acme", scope="customer", customer="cust-a")
    with app_with(settings, stream_max_s=1.5, stream_heartbeat_s=0.4, stream_retry_ms=1234) as c:
        reply = c.get("/v1/runs/run-a/stream", headers=auth(key))
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/event-stream")
    assert reply.headers["cache-control"] == "no-cache"
    opening, *rest = frames(reply.text)
    assert opening["retry"] == "1234"
    assert (opening["id"], opening["event"]) == (str(first), "run.status")
    snapshot = json.loads(opening["data"])
    assert (snapshot["run"], snapshot["customer"], snapshot["id"]) == ("run-a", "cust-a", first)
    assert snapshot["data"]["status"] == "Agent still running"  # GET /v1/runs/{run}'s shape
    assert snapshot["data"]["event_counts"] == {"run.started": 1}
    assert rest and all(f == {"": "keep-alive"} for f in rest), rest


@pytest.mark.usefixtures("two_customers")
def test_a_resumed_stream_replays_what_came_after_its_id_and_only_its_own(
    settings, engine, db: psycopg.Connection[Any], make_key
):
    ids = [notify(engine, db, "run-a", "cust-a", f"a{i}") for i in range(3)]
    notify(engine, db, "run-b", "cust-b", "b0")  # another customer's: never shown
    key = make_key(tenant="acme", scope="customer", customer="cust-a")
    with app_with(settings, stream_max_s=1.0, stream_heartbeat_s=5) as c:
        by_run = c.get("/v1/runs/run-a/stream", headers={**auth(key), "Last-Event-ID": str(ids[0])})
        by_customer = c.get("/v1/customers/cust-a/stream?last_event_id=0", headers=auth(key))
    # Everything of the scope after the resume id, whoever recorded it (ingest announces
    # status words too).
    of_run = "SELECT id FROM notifications WHERE subject = 'run-a' AND id > %s ORDER BY id"
    of_customer = "SELECT id FROM notifications WHERE customer_id = 'cust-a' ORDER BY id"
    for reply, query, args in ((by_run, of_run, (ids[0],)), (by_customer, of_customer, ())):
        expected = [r[0] for r in db.execute(query, args).fetchall()]
        assert reply.status_code == 200, reply.text
        opening, *events = frames(reply.text)
        assert set(opening) == {"retry"}  # a resumed stream has nothing to open with
        assert [json.loads(e["data"])["id"] for e in events] == expected
        bodies = [json.loads(e["data"]) for e in events]
        assert {(b["run"], b["customer"]) for b in bodies} == {("run-a", "cust-a")}
        mine = [b["data"]["status"] for b in bodies if b["id"] in ids]
        assert mine == [f"a{i}" for i in range(3) if ids[i] in expected]


def test_a_run_stored_before_the_id_grammar_is_followed_by_its_encoded_id(
    settings, engine, make_key
):
    seed_legacy_run(engine, settings, tenant="legacy", run="org-7/run-1", customer="a b")
    key = make_key(tenant="legacy", scope="support")
    with app_with(settings, stream_max_s=0.5) as c:
        by_run = c.get(f"/v1/runs/{segment('org-7/run-1')}/stream", headers=auth(key))
        by_customer = c.get(f"/v1/customers/{segment('a b')}/stream", headers=auth(key))
    assert by_run.status_code == 200, by_run.text
    snapshot = json.loads(frames(by_run.text)[0]["data"])
    assert (snapshot["run"], snapshot["customer"]) == ("org-7/run-1", "a b")
    assert by_customer.status_code == 200, by_customer.text
    assert json.loads(frames(by_customer.text)[0]["data"])["customer"] == "a b"
