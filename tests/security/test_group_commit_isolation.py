"""One tenant's bad input never changes another tenant's reply (issue #13 §1).

Concurrent small ingest requests of one API process share a transaction (group commit).
Here tenant A sends every bad value of issue #13 §5 (and every value PostgreSQL cannot
store) while tenant B sends valid events, all at once, over real HTTP to the served API:
each of B's events is stored and answered 200, each of A's requests gets its own 4xx, and
the rejections are counted under their own codes.
"""

from __future__ import annotations

import json
import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import httpx
import psycopg
import pytest

from api.ingest_group import store_group
from metering.db import create_db_engine, database_unavailable, raw_transaction
from metering.ingest.service import IngestRequest, PreparedRequest, prepare_request
from metering.ingest.store import IngestResult
from metering.keys_repo import ensure_tenant
from metering.prices import CatalogCache, load_catalog
from tests.helpers.events import BATCH, STRUCTURED, usage
from tests.helpers.services import plain_url

pytestmark = pytest.mark.timeout(180)

B_EVENTS = 480
THREADS = 24


@dataclass(frozen=True)
class Attempt:
    """One request: its headers, its body and the error code it must get (None: a 200)."""

    name: str
    headers: dict[str, str]
    body: bytes
    code: str | None


def _with(event: dict[str, Any], literal: str) -> bytes:
    """``event`` as JSON with ``"__X__"`` replaced by ``literal`` as sent on the wire."""
    return json.dumps(event).encode().replace(b'"__X__"', literal.encode())


def _binary(event_id: str, **overrides: str) -> tuple[dict[str, str], bytes]:
    """A binary-mode ``run.usage`` event: attributes in ``ce-`` headers, data as the body."""
    structured = usage(id=event_id, run="a-run", customer="a-cust")
    headers = {
        "content-type": "application/json",
        "ce-specversion": "1.0",
        "ce-id": structured["id"],
        "ce-source": structured["source"],
        "ce-type": structured["type"],
        "ce-subject": structured["subject"],
        "ce-time": structured["time"],
        **overrides,
    }
    return headers, json.dumps(structured["data"]).encode()


def bad_attempts() -> list[Attempt]:
    """Every bad value of issue #13 §5's ingest items and each value PostgreSQL refuses."""
    attempts = []

    def structured(name: str, code: str, field: str, literal: str) -> None:
        event = usage(id=f"a-{name}", run="a-run", customer="a-cust", tool_call_id="call-1")
        target = event["data"] if field.startswith("data.") else event
        target[field.removeprefix("data.")] = "__X__"
        attempts.append(Attempt(name, STRUCTURED, _with(event, literal), code))

    nul = '"x\\u0000"'
    for field in ("data.tool_call_id", "id", "source", "traceparent"):
        structured(f"NUL in {field}", "invalid_character", field, nul)
    for field in ("subject", "data.customer"):  # outside the id grammar, which says so
        structured(f"NUL in {field}", "invalid_id", field, nul)
    structured("NUL in model", "invalid_character", "data.model", '"agent-large-1\\u0000"')
    structured("lone surrogate", "malformed_json", "data.tool_call_id", '"\\ud800"')
    for moment in ("0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"):
        structured(f"time {moment}", "invalid_time", "time", json.dumps(moment))
    event = usage(id="a-nul-key", run="a-run", customer="a-cust")
    event["data"]["__KEY__"] = 1
    body = json.dumps(event).encode().replace(b"__KEY__", b"tool\\u0000call")
    attempts.append(Attempt("NUL in a key", STRUCTURED, body, "unknown_field"))
    event = usage(id="a-dup", run="a-run", customer="a-cust", input_tokens=1000)
    body = (
        json.dumps(event).encode().replace(b'"input_tokens"', b'"input_tokens": 1, "input_tokens"')
    )
    attempts.append(Attempt("duplicate key", STRUCTURED, body, "duplicate_key"))
    nul_batch = [usage(id="a-batch-ok", run="a-run", customer="a-cust"), usage(id="a-b")]
    nul_batch[1]["data"]["tool_call_id"] = "__X__"
    attempts.append(Attempt("NUL in a batch", BATCH, _with(nul_batch, nul), "invalid_character"))
    for name, overrides, code in [
        ("ce-id evt-%FF", {"ce-id": "evt-%FF"}, "invalid_header_encoding"),
        ("ce-id evt-%FE", {"ce-id": "evt-%FE"}, "invalid_header_encoding"),
        ("ce-source %ED%A0%80", {"ce-source": "src-%ED%A0%80"}, "invalid_header_encoding"),
        ("ce-subject %00", {"ce-subject": "a-run%00"}, "invalid_id"),
        ("ce-time year 0", {"ce-time": "0001-01-01T00:00:00+01:00"}, "invalid_time"),
        ("ce-time year 10000", {"ce-time": "9999-12-31T23:59:59-01:00"}, "invalid_time"),
    ]:
        headers, body = _binary(f"a-bin-{name}", **overrides)
        attempts.append(Attempt(name, headers, body, code))
    return attempts


def good_attempts() -> list[Attempt]:
    """Tenant B's valid events: single structured events, some binary, spread over runs."""
    attempts = []
    for i in range(B_EVENTS):
        event = usage(id=f"b-{i}", run=f"b-run-{i % 12}", customer="b-cust", step=i + 1)
        if i % 4:
            attempts.append(Attempt(f"b-{i}", STRUCTURED, json.dumps(event).encode(), None))
        else:
            data = event.pop("data")
            headers = {"content-type": "application/json"}
            headers.update({f"ce-{name}": str(value) for name, value in event.items()})
            attempts.append(Attempt(f"b-{i}", headers, json.dumps(data).encode(), None))
    return attempts


def rejected_by_code(base: str) -> dict[str, float]:
    counts: dict[str, float] = {}
    for line in httpx.get(f"{base}/metrics", timeout=30).text.splitlines():
        if line.startswith('fairmeter_events_total{code="') and 'result="rejected"' in line:
            code = line.split('code="', 1)[1].split('"', 1)[0]
            counts[code] = counts.get(code, 0.0) + float(line.rsplit(" ", 1)[1])
    return counts


def test_one_tenants_bad_values_never_refuse_or_drop_another_tenants_events(
    live_server, make_key, db
):
    keys = {"A": make_key(tenant="tenant-a"), "B": make_key(tenant="tenant-b")}
    bad = bad_attempts() * 12
    good = good_attempts()
    work = [("A", a) for a in bad] + [("B", a) for a in good]
    random.Random(13).shuffle(work)
    before = rejected_by_code(live_server)

    def send(item: tuple[str, Attempt]) -> tuple[str, Attempt, int, dict[str, Any]]:
        tenant, attempt = item
        headers = {**attempt.headers, "authorization": f"Bearer {keys[tenant]}"}
        reply = httpx.post(
            f"{live_server}/v1/events", headers=headers, content=attempt.body, timeout=60
        )
        return tenant, attempt, reply.status_code, reply.json()

    with ThreadPoolExecutor(THREADS) as pool:
        replies = list(pool.map(send, work))

    b_wrong = [(a.name, s, r) for t, a, s, r in replies if t == "B" and s != 200]
    assert not b_wrong, f"{len(b_wrong)} of tenant B's {len(good)} valid requests: {b_wrong[:5]}"
    assert all(r["accepted"] == 1 for t, _, _, r in replies if t == "B")
    a_wrong = [
        (a.name, s, r.get("code"))
        for t, a, s, r in replies
        if t == "A" and (s not in (400, 422) or r.get("code") != a.code)
    ]
    assert not a_wrong, f"{len(a_wrong)} of tenant A's requests got another answer: {a_wrong[:8]}"
    stored = dict(db.execute("SELECT tenant_id, count(*) FROM events GROUP BY 1").fetchall())
    assert stored == {"tenant-b": B_EVENTS}
    usage_lines = db.execute("SELECT count(*), sum(input_tokens) FROM usage_lines").fetchone()
    assert usage_lines == (B_EVENTS, B_EVENTS * 1000)

    after = rejected_by_code(live_server)
    expected: dict[str, int] = {}
    for attempt in bad:
        assert attempt.code is not None
        expected[attempt.code] = expected.get(attempt.code, 0) + 1
    counted = {code: after.get(code, 0.0) - before.get(code, 0.0) for code in expected}
    assert counted == expected


# --- store_group: whatever the shared transaction meets, each request gets its own answer ---


@pytest.fixture
def prepare(engine: Any, settings: Any, db: Any) -> Any:
    catalogs = CatalogCache(lambda: _catalog(engine))
    with raw_transaction(engine) as conn:
        for tenant in ("acme", "globex"):
            ensure_tenant(conn, tenant)

    def factory(*events: dict[str, Any], tenant: str = "acme") -> PreparedRequest:
        request = IngestRequest(tenant, list(events), single=False, received_at=datetime.now(UTC))
        return prepare_request(request, settings, catalogs)

    return factory


def _catalog(engine: Any) -> Any:
    with raw_transaction(engine) as conn:
        return load_catalog(conn)


def results(outcomes: list[Any]) -> list[Any]:
    return [
        [e.result for e in o.events] if isinstance(o, IngestResult) else (o.status, o.code)
        for o in outcomes
    ]


def test_a_value_the_database_refuses_fails_only_its_own_request(engine, prepare, db):
    """Validation refuses a NUL; were one to slip through, the DataError it meets in the
    group's transaction must still be that request's 400, and the others stored."""
    valid = prepare(usage(id="slipped", tool_call_id="call-1"), tenant="globex")
    event = valid.events[0]
    slipped = replace(valid, events=[replace(event, data={**event.data, "tool_call_id": "x\0"})])
    group = [prepare(usage(id="a1")), slipped, prepare(usage(id="a2", run="run-2"))]
    outcomes = store_group(engine, group)
    assert results(outcomes) == [["accepted"], (400, "invalid_value"), ["accepted"]]
    assert db.execute("SELECT tenant_id, event_id FROM events ORDER BY 2").fetchall() == [
        ("acme", "a1"),
        ("acme", "a2"),
    ]


def test_a_deadlock_in_the_shared_transaction_is_no_ones_error(engine, prepare, db):
    """A real deadlock, injected from another connection: the group holds tenant acme's run
    and waits for globex's, which that connection holds while it asks for acme's. PostgreSQL
    aborts the group; each request, stored again alone, is accepted."""
    store_group(engine, [prepare(usage(id="a0", run="run-a"))])
    store_group(engine, [prepare(usage(id="g0", run="run-g"), tenant="globex")])
    group = [
        prepare(usage(id="a1", run="run-a")),
        prepare(usage(id="g1", run="run-g"), tenant="globex"),
    ]
    lock = "SELECT 1 FROM runs WHERE tenant_id = %s AND subject = %s FOR UPDATE"
    with psycopg.connect(plain_url(engine.url.render_as_string(hide_password=False))) as other:
        other.execute("SET deadlock_timeout = '60s'")  # so that the group is the one aborted
        other.execute(lock, ("globex", "run-g"))
        with ThreadPoolExecutor(1) as pool:
            stored = pool.submit(store_group, engine, group)
            _wait_until_blocked(db, other.info.backend_pid)
            other.execute(lock, ("acme", "run-a"))  # closes the cycle; the group is aborted
            other.rollback()
            outcomes = stored.result(timeout=60)
    assert results(outcomes) == [["accepted"], ["accepted"]]
    assert db.execute("SELECT count(*) FROM events").fetchone() == (4,)


def _wait_until_blocked(db: Any, blocker_pid: int) -> None:
    """Until some backend waits for a lock that ``blocker_pid`` holds."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        waiting = db.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
            (blocker_pid,),
        ).fetchone()[0]
        if waiting:
            return
        time.sleep(0.01)
    raise TimeoutError("the group never waited for the other connection's lock")


def test_an_unavailable_database_answers_every_request_at_once(settings, prepare):
    """No request's fault: each gets the same 503 error, without one connect per request."""
    broken = settings.model_copy(update={"database_url": "postgresql://postgres@127.0.0.1:1/x"})
    engine = create_db_engine(broken)
    try:
        group = [prepare(usage(id=f"e{i}", run=f"run-{i}")) for i in range(4)]
        outcomes = store_group(engine, group)
    finally:
        engine.dispose()
    assert len({id(o) for o in outcomes}) == 1
    assert isinstance(outcomes[0], Exception) and database_unavailable(outcomes[0])
