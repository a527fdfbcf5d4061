"""Bad input gets a clear problem+json error, and nothing already accepted changes."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.helpers.events import BATCH, STRUCTURED, auth, event, usage


def post_raw(client: Any, key: str, content: bytes | str, headers: dict[str, str]) -> Any:
    return client.post("/v1/events", content=content, headers=auth(key, **headers))


def post(client: Any, key: str, body: Any, headers: dict[str, str] = STRUCTURED) -> Any:
    return post_raw(client, key, json.dumps(body), headers)


def problem_of(reply: Any, status: int) -> dict[str, Any]:
    assert reply.status_code == status, reply.text
    assert reply.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = reply.json()
    assert body["status"] == status and body["code"]
    return body


def paths(problem: dict[str, Any]) -> set[str]:
    return {e["path"] for e in problem.get("errors", [])}


def stored_count(db: Any) -> int:
    return int(db.execute("SELECT count(*) FROM events").fetchone()[0])


def test_same_id_with_other_content_is_409_and_stored_event_is_unchanged(client, make_key, db):
    key = make_key()
    post(client, key, usage(id="e1", input_tokens=100))
    before = db.execute("SELECT body_hash, data FROM events").fetchall()
    reply = post(client, key, usage(id="e1", input_tokens=999))
    problem = problem_of(reply, 409)
    assert problem["code"] == "event_conflict"
    assert problem["conflicting_ids"] == ["agent-backend/eu-1/e1"]
    assert db.execute("SELECT body_hash, data FROM events").fetchall() == before
    assert db.execute("SELECT sum(amount_micros) FROM ledger_entries").fetchone()[0] == 7800


def test_conflict_inside_a_batch_stores_nothing_of_the_batch(client, make_key, db):
    key = make_key()
    post(client, key, usage(id="e1"))
    reply = post(client, key, [usage(id="fresh"), usage(id="e1", output_tokens=1)], BATCH)
    assert problem_of(reply, 409)["code"] == "event_conflict"
    assert stored_count(db) == 1


def test_batch_with_one_invalid_event_stores_nothing_and_names_the_field(client, make_key, db):
    key = make_key()
    batch = [usage(id="ok-1"), usage(id="bad", input_tokens=-5), usage(id="ok-2")]
    problem = problem_of(post(client, key, batch, BATCH), 422)
    assert paths(problem) == {"$[1].data.input_tokens"}
    assert problem["errors"][0]["code"] == "out_of_range"
    assert stored_count(db) == 0


def test_unknown_model_is_422_unknown_model(client, make_key, db):
    problem = problem_of(post(client, make_key(), usage(model="gpt-nonexistent")), 422)
    assert problem["code"] == "unknown_model"
    assert paths(problem) == {"$.data.model"}


@pytest.mark.parametrize(
    ("shift", "code"),
    [(timedelta(minutes=6), "time_in_future"), (timedelta(days=-36), "time_too_old")],
)
def test_event_time_outside_the_window_is_422(client, make_key, db, shift, code):
    body = usage(time=datetime.now(UTC) + shift)
    problem = problem_of(post(client, make_key(), body), 422)
    assert problem["code"] == code
    assert paths(problem) == {"$.time"}


def test_time_that_is_not_rfc3339_is_422(client, make_key, db):
    body = usage()
    body["time"] = "yesterday"
    assert problem_of(post(client, make_key(), body), 422)["code"] == "invalid_time"


def test_missing_fields_are_each_named(client, make_key, db):
    body = usage()
    del body["id"]
    del body["data"]["model"]
    del body["data"]["customer"]
    problem = problem_of(post(client, make_key(), body), 422)
    assert paths(problem) == {"$.id", "$.data.model", "$.data.customer"}


@pytest.mark.parametrize(
    ("field", "value", "code"),
    [
        ("input_tokens", "12", "invalid_type"),
        ("input_tokens", True, "invalid_type"),
        ("output_tokens", 1.5, "invalid_type"),
        ("output_tokens", 10**30, "out_of_range"),
        ("step", -1, "out_of_range"),
        ("attempt", 0, "out_of_range"),
        ("replay", "yes", "invalid_type"),
        ("surprise", 1, "unknown_field"),
    ],
)
def test_wrong_types_and_unknown_fields_are_422(client, make_key, db, field, value, code):
    body = usage()
    body["data"][field] = value
    problem = problem_of(post(client, make_key(), body), 422)
    assert problem["errors"] == [
        {"path": f"$.data.{field}", "code": code, "message": problem["errors"][0]["message"]}
    ]


def test_unknown_event_type_is_422(client, make_key, db):
    problem = problem_of(post(client, make_key(), event(type="run.exploded")), 422)
    assert problem["code"] == "unknown_type"


def test_wrong_content_type_is_415(client, make_key, db):
    reply = post_raw(client, make_key(), json.dumps(usage()), {"content-type": "text/plain"})
    assert problem_of(reply, 415)["code"] == "unsupported_media_type"


def test_malformed_json_is_400(client, make_key, db):
    reply = post_raw(client, make_key(), b'{"specversion": "1.0",', STRUCTURED)
    assert problem_of(reply, 400)["code"] == "malformed_json"


@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity"])
def test_non_finite_numbers_are_refused(client, make_key, db, literal):
    body = json.dumps(usage()).replace('"input_tokens": 1000', '"input_tokens": X')
    reply = post_raw(client, make_key(), body.replace("X", literal.decode()).encode(), STRUCTURED)
    assert reply.status_code in (400, 422)
    problem_of(reply, reply.status_code)


def test_json_nested_100000_deep_is_400_not_500(client, make_key, db):
    deep = b'{"specversion": "1.0", "data": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    problem = problem_of(post_raw(client, make_key(), deep, STRUCTURED), 400)
    assert problem["code"] == "json_too_deep"


def test_nested_extension_value_is_422(client, make_key, db):
    body = usage()
    body["traceparent"] = {"a": {"b": {"c": [1, 2, 3]}}}
    assert problem_of(post(client, make_key(), body), 422)["code"] == "invalid_type"


def test_body_over_one_mebibyte_is_413(client, make_key, db):
    big = [usage(id=f"e{i}", tool_call_id="x" * 200) for i in range(3000)]
    content = json.dumps(big)
    assert len(content) > 1024 * 1024
    assert problem_of(post_raw(client, make_key(), content, BATCH), 413)["code"] == (
        "payload_too_large"
    )
    assert stored_count(db) == 0


def test_batch_over_1000_events_is_413(client, make_key, db):
    batch = [event(type="run.heartbeat", id=f"h{i}") for i in range(1001)]
    assert problem_of(post(client, make_key(), batch, BATCH), 413)["code"] == "payload_too_large"
    assert stored_count(db) == 0


def test_batch_that_is_not_an_array_is_400(client, make_key, db):
    assert problem_of(post(client, make_key(), usage(), BATCH), 400)["code"] == "batch_not_array"


def test_run_events_must_name_one_customer_within_a_request(client, make_key, db):
    batch = [usage(id="a", customer="c1"), usage(id="b", customer="c2")]
    problem = problem_of(post(client, make_key(), batch, BATCH), 422)
    assert problem["code"] == "customer_mismatch"
    assert paths(problem) == {"$[1].data.customer"}
    assert stored_count(db) == 0


def test_run_events_must_name_the_customer_that_owns_the_run(client, make_key, db):
    key = make_key()
    post(client, key, usage(id="a", customer="c1"))
    problem = problem_of(post(client, key, usage(id="b", customer="c2")), 422)
    assert problem["code"] == "customer_mismatch"
    assert stored_count(db) == 1
