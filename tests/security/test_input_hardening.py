"""Hostile input on every endpoint that takes a body or parameters: 4xx problem+json, never 500.

The endpoints come from the OpenAPI document, so a new one is covered as soon as it exists.
``tests/api/test_ingest_errors.py`` covers POST /v1/events in depth; here every body-taking
endpoint gets the same treatment, and every query and path parameter gets bad values of its
documented type.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from typing import Any
from urllib.parse import quote

import pytest

from tests.helpers.events import STRUCTURED, auth, usage
from tests.security.harness import TenantData, client_with, seed_tenant
from tests.security.test_idor_matrix import Operation, bodies, discover, path_values

pytestmark = pytest.mark.timeout(120)

WEBHOOK_SECRET = "whsec_hardening"
DEEP = b"[" * 100_000 + b"]" * 100_000


def with_unknown_field(obj: dict[str, Any]) -> dict[str, Any]:
    # A CloudEvent may carry extension attributes at the top; its data may not.
    if "specversion" in obj:
        return {**obj, "data": {**obj["data"], "surprise": 1}}
    return {**obj, "surprise": 1}


def hostile_bodies(valid: bytes) -> dict[str, tuple[bytes, set[int]]]:
    """Name → (body, acceptable statuses), derived from a valid JSON object body."""
    obj = json.loads(valid)
    first = next(iter(obj))  # a field the schema declares

    def with_value(literal: bytes) -> bytes:
        return json.dumps({**obj, first: "__X__"}).encode().replace(b'"__X__"', literal)

    bad = {400, 422}
    return {
        "over the size limit": (b'{"x": "' + b"x" * (1024 * 1024 + 10) + b'"}', {413}),
        "nested 100,000 deep": (DEEP, {400}),
        "nested 100,000 deep in a field": (with_value(DEEP), {400}),
        "NaN": (with_value(b"NaN"), {400}),
        "Infinity": (with_value(b"-Infinity"), {400}),
        "huge integer": (with_value(b"1" + b"0" * 400), bad),
        "huge float": (with_value(b"1e999"), bad),
        "unknown field": (json.dumps(with_unknown_field(obj)).encode(), bad),
        "wrong type (array)": (json.dumps([obj]).encode(), bad),
        "wrong type (object field)": (with_value(b'{"a": 1}'), bad),
        "NUL in a string": (with_value(b'"a\\u0000b"'), bad),
        "lone surrogate": (with_value(b'"\\ud800"'), bad),
        "not UTF-8": (b'{"reason": "\xff\xfe"}', bad),
        "not JSON": (b'{"reason": ', {400}),
        "empty": (b"", bad),
    }


def assert_problem(reply: Any, allowed: set[int], what: str, *, otlp: bool = False) -> None:
    """A refusal in the API's envelope: a problem document, or for OTLP/HTTP the
    google.rpc.Status its specification requires (JSON for a JSON request)."""
    assert reply.status_code in allowed, f"{what}: {reply.status_code} {reply.text[:300]}"
    if reply.status_code < 300:
        return
    if otlp:
        assert reply.headers["content-type"].startswith("application/json"), what
        assert reply.json()["message"], what
        return
    assert reply.headers["content-type"].startswith("application/problem+json"), what
    assert reply.json()["code"], what


def sign(payload: bytes) -> str:
    stamp = int(time.time())
    mac = hmac.new(WEBHOOK_SECRET.encode(), f"{stamp}.".encode() + payload, hashlib.sha256)
    return f"t={stamp},v1={mac.hexdigest()}"


@pytest.fixture
def seeded(engine, settings, db) -> TenantData:
    return seed_tenant(engine, settings)


@pytest.fixture
def api(settings, db):
    """The app with the Stripe webhook secret set, so webhooks get past the signature."""
    with client_with(settings, stripe_webhook_secret=WEBHOOK_SECRET) as client:
        yield client


@pytest.fixture
def operations(api) -> list[Operation]:
    return discover(api.get("/schema/openapi.json").json())


def test_every_body_taking_endpoint_refuses_hostile_bodies(api, operations, make_key, seeded):
    keys = {s: make_key(scope=s) for s in ("support", "ingest", "admin")}
    # The held run: it has no open dispute, so a dispute body is judged on its content.
    params = dict(path_values(seeded), run=seeded.runs[1])
    valid = bodies(seeded)
    with_bodies = [op for op in operations if op.body and op.scopes]
    assert len(with_bodies) >= 6
    for op in with_bodies:
        assert op.scopes is not None
        key = keys[next(s for s in ("support", "ingest", "admin") if s in op.scopes)]
        media_type, body = valid[op.body]  # type: ignore[index]
        url = op.path.format(**{name: params[name] for name in op.params})
        otlp = op.path == "/v1/traces"
        for name, (content, allowed) in hostile_bodies(body).items():
            if otlp and name == "unknown field":
                allowed = {200}  # the OTLP specification: receivers ignore unknown fields
            reply = api.request(
                op.method, url, content=content, headers=auth(key, **{"content-type": media_type})
            )
            assert_problem(reply, allowed, f"{op.label} {name}", otlp=otlp)


def test_the_stripe_webhook_refuses_hostile_bodies_even_when_signed(api, db):
    valid = json.dumps({"id": "evt_1", "type": "invoice.finalized"}).encode()
    for name, (content, allowed) in hostile_bodies(valid).items():
        reply = api.post(
            "/webhooks/stripe",
            content=content,
            headers={"stripe-signature": sign(content), "content-type": "application/json"},
        )
        if name in {"unknown field", "NUL in a string", "lone surrogate", "empty", "huge float"}:
            allowed = allowed | {200}  # Stripe's events are open-ended; stored as sent
        if reply.status_code == 200:
            continue
        assert_problem(reply, allowed, f"webhook {name}")
    unsigned = api.post("/webhooks/stripe", content=valid, headers={"stripe-signature": "t=1,v1=0"})
    assert_problem(unsigned, {400}, "webhook with a bad signature")


BAD_QUERY_VALUES = {
    "integer": ["abc", "-1", "0", "1.5", "99999999999999999999999", "-99999999999999999999999"],
    "boolean": ["maybe", "2"],
    "date": ["2024-13-45", "0000-01-01", "0001-01-01", "9999-12-31", "yesterday"],
    "string": ["\x00", "a\x00b", "x" * 4000, "%", "' OR 1=1 --", "\ud7ff\ue000"],
}
BAD_PATH_VALUES = ["\x00", "a\x00b", "x" * 4000, "..", "' OR 1=1 --", "0000-01", "9999-12", "-1"]


def query_params(doc: dict[str, Any], op: Operation) -> list[tuple[str, str]]:
    """(name, kind) of each query parameter, the kind as in BAD_QUERY_VALUES."""
    spec = doc["paths"][op.path][op.method.lower()]
    found = []
    for param in spec.get("parameters", []):
        if param["in"] != "query":
            continue
        schema = param["schema"]
        options = schema.get("oneOf", [schema])
        kinds = {o.get("format") or o.get("type") for o in options} - {"null"}
        kind = next(k for k in ("date", "integer", "boolean", "string") if k in kinds)
        found.append((param["name"], kind))
    return found


def test_every_query_and_path_parameter_refuses_bad_values(api, operations, make_key, seeded):
    doc = api.get("/schema/openapi.json").json()
    admin = make_key(scope="admin")
    customer = make_key(scope="customer", customer=seeded.customer)
    params = path_values(seeded)
    checked = 0
    for op in operations:
        if op.method != "GET" or not op.scopes:
            continue
        key = admin if "admin" in op.scopes else customer
        url = op.path.format(**{name: params[name] for name in op.params})
        for name, kind in query_params(doc, op):
            for value in BAD_QUERY_VALUES[kind]:
                reply = api.get(url, params={name: value}, headers=auth(key))
                checked += 1
                assert reply.status_code < 500, f"{op.label}?{name}={value!r}: {reply.text}"
                if reply.status_code >= 400:
                    assert_problem(reply, {400, 404, 422}, f"{op.label}?{name}={value[:20]!r}")
        for name in op.params:
            for value in BAD_PATH_VALUES:
                bad = dict(params, **{name: quote(value, safe="")})
                reply = api.get(op.path.format(**{n: bad[n] for n in op.params}), headers=auth(key))
                checked += 1
                assert reply.status_code < 500, f"{op.label} {name}={value[:20]!r}: {reply.text}"
    assert checked > 100


@pytest.mark.parametrize(
    "cursor",
    [
        "not base64!",
        "MjAyNC0wMS0wMXwx",  # a well-formed cursor, "2024-01-01|1"
        "OTk5OTktMDEtMDF8MQ==",  # "99999-01-01|1": no such date
        "MjAyNC0wMS0wMXw5OTk5OTk5OTk5OTk5OTk5OTk5OTk5",  # run id past bigint
        "AAAA",  # NUL bytes
        "A" * 10_000,
    ],
)
def test_statement_cursors_are_checked(api, make_key, seeded, cursor):
    key = make_key(scope="customer", customer=seeded.customer)
    url = f"/v1/customers/{seeded.customer}/statements/{path_values(seeded)['period']}"
    reply = api.get(url, params={"cursor": cursor}, headers=auth(key))
    assert reply.status_code in (200, 422), reply.text
    if reply.status_code == 422:
        assert reply.json()["code"] == "invalid_cursor"


@pytest.mark.parametrize("percent", ["NaN", "sNaN", "Infinity", "-0", "1e999999999", "0.001"])
def test_credit_percentages_that_are_not_a_share_are_422(api, make_key, seeded, percent):
    reply = api.post(
        f"/v1/support/runs/{seeded.runs[0]}/credit",
        content=json.dumps({"percent": percent, "reason": "x"}),
        headers=auth(make_key(scope="support"), **{"content-type": "application/json"}),
    )
    if percent == "0.001":  # a valid share that rounds to no money is not an error
        assert reply.status_code in (200, 422), reply.text
        return
    assert_problem(reply, {422}, f"percent {percent}")


@pytest.mark.parametrize("text", ["a\x00b", "\ud800"], ids=["NUL", "lone surrogate"])
@pytest.mark.parametrize("field", ["id", "subject", "source", "data.customer", "traceparent"])
def test_events_with_text_postgres_cannot_store_are_refused(api, make_key, db, field, text):
    event = usage()
    if field.startswith("data."):
        event["data"][field[5:]] = text
    else:
        event[field] = text
    body = json.dumps(event).encode()  # escapes both as \\u sequences, which is valid JSON
    reply = api.post("/v1/events", content=body, headers=auth(make_key(), **STRUCTURED))
    assert_problem(reply, {400, 422}, f"{field}={text!r}")
    assert db.execute("SELECT count(*) FROM events").fetchone()[0] == 0
