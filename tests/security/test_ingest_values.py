"""Ingest input that cannot be stored as sent gets a clear 4xx and changes nothing (issue #13
§1 and §5): never a 500, never a silent change of what the client sent."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from metering.ingest.validation import TimeWindow, validate_event
from tests.helpers.events import BATCH, STRUCTURED, auth, usage


def problem_of(reply: Any, status: int, code: str) -> dict[str, Any]:
    assert reply.status_code == status, reply.text
    assert reply.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = reply.json()
    assert body["code"] == code, body
    return body


def paths(problem: dict[str, Any]) -> list[str]:
    return [e["path"] for e in problem.get("errors", [])]


def stored_ids(db: Any) -> list[str]:
    return [row[0] for row in db.execute("SELECT event_id FROM events ORDER BY 1").fetchall()]


def binary_headers(event: dict[str, Any], **overrides: str) -> dict[str, str]:
    headers = {"content-type": "application/json"}
    headers.update({f"ce-{name}": str(v) for name, v in event.items() if name != "data"})
    headers.update(overrides)
    return headers


# --- time: outside what a datetime can hold once in UTC -------------------------------------

OVERFLOWING_TIMES = ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"]


@pytest.mark.parametrize("moment", OVERFLOWING_TIMES)
def test_a_time_that_overflows_in_utc_is_422_invalid_time(client, make_key, db, moment):
    event = usage(id="e1")
    event["time"] = moment
    reply = client.post(
        "/v1/events", content=json.dumps(event), headers=auth(make_key(), **STRUCTURED)
    )
    assert paths(problem_of(reply, 422, "invalid_time")) == ["$.time"]
    assert stored_ids(db) == []


@pytest.mark.parametrize("moment", OVERFLOWING_TIMES)
def test_a_ce_time_header_that_overflows_in_utc_is_422_invalid_time(client, make_key, db, moment):
    event = usage(id="e1")
    headers = binary_headers(event, **{"ce-time": moment})
    reply = client.post(
        "/v1/events", content=json.dumps(event["data"]), headers=auth(make_key(), **headers)
    )
    assert paths(problem_of(reply, 422, "invalid_time")) == ["$.time"]
    assert stored_ids(db) == []


# --- duplicate JSON object keys: refused, not "last one wins" --------------------------------


def _twice(event: Any, key: str, first_value: str) -> bytes:
    """``event`` as JSON with ``key`` written twice: ``first_value`` first, then its own."""
    return (
        json.dumps(event)
        .encode()
        .replace(f'"{key}"'.encode(), f'"{key}": {first_value}, "{key}"'.encode(), 1)
    )


@pytest.mark.parametrize(
    ("where", "key", "first_value"),
    [
        ("data", "input_tokens", "1"),
        ("attributes", "id", '"other-id"'),
        ("attributes", "subject", '"run-9"'),
        ("data", "customer", '"cust-9"'),
    ],
)
def test_a_key_sent_twice_in_an_event_is_400_duplicate_key(
    client, make_key, db, where, key, first_value
):
    body = _twice(usage(id="e1"), key, first_value)
    reply = client.post("/v1/events", content=body, headers=auth(make_key(), **STRUCTURED))
    problem = problem_of(reply, 400, "duplicate_key")
    assert f'"{key}"' in problem["detail"]
    assert stored_ids(db) == []


def test_a_key_sent_twice_in_one_event_of_a_batch_refuses_the_batch(client, make_key, db):
    batch = [usage(id="ok-1"), usage(id="twice", output_tokens=500), usage(id="ok-2")]
    body = json.dumps(batch).encode().replace(b'"id": "twice"', b'"id": "twice", "id": "twice"')
    reply = client.post("/v1/events", content=body, headers=auth(make_key(), **BATCH))
    problem_of(reply, 400, "duplicate_key")
    assert stored_ids(db) == []


def test_a_key_sent_twice_in_binary_mode_data_is_400(client, make_key, db):
    event = usage(id="e1")
    body = _twice(event["data"], "output_tokens", "0")
    reply = client.post(
        "/v1/events", content=body, headers=auth(make_key(), **binary_headers(event))
    )
    problem_of(reply, 400, "duplicate_key")
    assert stored_ids(db) == []


def test_a_colon_written_as_an_escape_is_no_duplicate(client, make_key, db):
    """The cheap count cannot tell here, so the exact check decides: one key each."""
    key = make_key()
    body = json.dumps(usage(id="e1")).encode().replace(b'"e1"', b'"e1\\u003a2"')
    reply = client.post("/v1/events", content=body, headers=auth(key, **STRUCTURED))
    assert reply.status_code == 200, reply.text
    body = _twice(usage(id="e2"), "input_tokens", "1").replace(b'"e2"', b'"e2\\u003a3"')
    reply = client.post("/v1/events", content=body, headers=auth(key, **STRUCTURED))
    problem_of(reply, 400, "duplicate_key")
    assert stored_ids(db) == ["e1:2"]


# --- binary mode: ce- headers are percent-encoded UTF-8, or refused ---------------------------


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("ce-id", "evt-%FF"),
        ("ce-id", "evt-%FE"),
        ("ce-source", "src-%ED%A0%80"),  # an encoded surrogate: no character
        ("ce-subject", "run-%C0%A0"),  # an overlong space: the binding's own example
        ("ce-subject", "run-%E2%82"),  # a truncated sequence
        ("ce-traceparent", "trace-%"),  # a '%' that was not encoded
        ("ce-id", "evt-%zz"),
    ],
)
def test_a_ce_header_that_is_not_percent_encoded_utf8_is_400(client, make_key, db, header, value):
    event = usage(id="e1")
    headers = binary_headers(event, **{header: value})
    reply = client.post(
        "/v1/events", content=json.dumps(event["data"]), headers=auth(make_key(), **headers)
    )
    problem = problem_of(reply, 400, "invalid_header_encoding")
    assert header in problem["detail"]
    assert stored_ids(db) == []


def test_two_events_whose_ids_differ_only_in_invalid_bytes_are_both_refused(client, make_key, db):
    key = make_key()
    for value in ("evt-%FF", "evt-%FE"):
        event = usage(id="unused")
        headers = binary_headers(event, **{"ce-id": value})
        reply = client.post(
            "/v1/events", content=json.dumps(event["data"]), headers=auth(key, **headers)
        )
        problem_of(reply, 400, "invalid_header_encoding")
    assert stored_ids(db) == []


def test_a_raw_non_ascii_byte_in_a_ce_header_is_400(client, make_key, db):
    event = usage(id="e1")
    headers = [(k.encode(), v.encode()) for k, v in binary_headers(event).items()]
    headers = [(k, v + b"\xc3\xa9" if k == b"ce-subject" else v) for k, v in headers]
    headers.append((b"authorization", f"Bearer {make_key()}".encode()))
    reply = client.post("/v1/events", content=json.dumps(event["data"]), headers=headers)
    problem_of(reply, 400, "invalid_header_encoding")
    assert stored_ids(db) == []


def test_a_ce_header_sent_twice_is_400(live_server, make_key, db):
    """Over real HTTP: the test client joins repeated headers into one ("e1, e2")."""
    event = usage(id="e1")
    headers = [(k.encode(), v.encode()) for k, v in binary_headers(event).items()]
    headers += [(b"CE-ID", b"e2"), (b"authorization", f"Bearer {make_key()}".encode())]
    reply = httpx.post(
        f"{live_server}/v1/events", content=json.dumps(event["data"]), headers=headers, timeout=30
    )
    problem_of(reply, 400, "duplicate_header")
    assert stored_ids(db) == []


def test_percent_encoded_utf8_in_a_ce_header_is_stored_as_its_characters(client, make_key, db):
    event = usage(id="e1")
    headers = binary_headers(event, **{"ce-id": "evt-%C3%A9%25"})
    reply = client.post(
        "/v1/events", content=json.dumps(event["data"]), headers=auth(make_key(), **headers)
    )
    assert reply.status_code == 200, reply.text
    assert stored_ids(db) == ["evt-é%"]


# --- text PostgreSQL cannot store: refused by validation, with its path ----------------------

TEXT_FIELDS = [
    "id",
    "source",
    "subject",
    "traceparent",
    "data.customer",
    "data.model",
    "data.tool_call_id",
]


ID_FIELDS = ("subject", "data.customer")


@pytest.mark.parametrize("field", TEXT_FIELDS)
def test_a_nul_in_any_text_is_422_naming_its_path(client, make_key, db, field):
    event = usage(id="e1", tool_call_id="call-1")
    target = event["data"] if field.startswith("data.") else event
    target[field.removeprefix("data.")] = "x\u0000y"
    reply = client.post(
        "/v1/events", content=json.dumps(event), headers=auth(make_key(), **STRUCTURED)
    )
    # A run or customer id holding a NUL is outside the id grammar: that is what is said.
    code = "invalid_id" if field in ID_FIELDS else "invalid_character"
    assert paths(problem_of(reply, 422, code)) == [f"$.{field}"]
    assert stored_ids(db) == []


def test_a_nul_in_one_event_of_a_batch_names_that_event(client, make_key, db):
    batch = [usage(id="ok"), usage(id="bad", tool_call_id="call\u0000")]
    reply = client.post("/v1/events", content=json.dumps(batch), headers=auth(make_key(), **BATCH))
    assert paths(problem_of(reply, 422, "invalid_character")) == ["$[1].data.tool_call_id"]
    assert stored_ids(db) == []


def test_a_percent_encoded_nul_in_a_ce_header_is_422(client, make_key, db):
    event = usage(id="e1")
    headers = binary_headers(event, **{"ce-subject": "run%00"})
    reply = client.post(
        "/v1/events", content=json.dumps(event["data"]), headers=auth(make_key(), **headers)
    )
    assert paths(problem_of(reply, 422, "invalid_id")) == ["$.subject"]
    assert stored_ids(db) == []


@pytest.mark.parametrize(("where", "code"), [("data", "unknown_field"), ("event", "invalid_name")])
def test_a_nul_in_an_object_key_is_refused(client, make_key, db, where, code):
    event = usage(id="e1")
    (event["data"] if where == "data" else event)["ke\u0000y"] = "x"
    reply = client.post(
        "/v1/events", content=json.dumps(event), headers=auth(make_key(), **STRUCTURED)
    )
    problem_of(reply, 422, code)
    assert stored_ids(db) == []


@pytest.mark.parametrize("text", ["\ud800", "a\udfffb", "x\u0000", "é\u0000"])
def test_validation_refuses_text_postgres_cannot_store_from_any_caller(text):
    """JSON decoding refuses a lone surrogate; a Python caller (the CLI, a test) can still
    pass one, and validation is what stands before the database."""
    now = datetime.now(UTC)
    window = TimeWindow(now=now, max_future=timedelta(minutes=5), max_age=timedelta(days=1))
    event = usage(id="e1", tool_call_id=text)
    event["ext"] = text
    result = validate_event(event, "$", 0, window)
    assert isinstance(result, list)
    assert {(e.path, e.code) for e in result} == {
        ("$.data.tool_call_id", "invalid_character"),
        ("$.ext", "invalid_character"),
    }
