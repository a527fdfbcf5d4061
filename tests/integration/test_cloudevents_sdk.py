"""The real CloudEvents Python SDK, used as a client against the real server over HTTP."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from cloudevents.core.bindings.http import to_binary, to_structured
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent
from cloudevents.v1.http import CloudEvent as LegacyCloudEvent
from cloudevents.v1.http import to_binary as legacy_to_binary
from cloudevents.v1.http import to_structured as legacy_to_structured


def sdk_event(event_id: str, run: str = "sdk-run", **overrides: Any) -> CloudEvent:
    data = {
        "customer": "cust-sdk",
        "step": 1,
        "attempt": 1,
        "model": "agent-small-1",
        "input_tokens": 4000,
        "cached_input_tokens": 0,
        "output_tokens": 800,
        **overrides,
    }
    attributes = {
        "id": event_id,
        "source": "agent-backend/eu-1",
        "type": "run.usage",
        "subject": run,
        "time": datetime.now(UTC) - timedelta(seconds=5),
        "datacontenttype": "application/json",
    }
    return CloudEvent(attributes=attributes, data=data)


def send(base: str, key: str, headers: dict[str, str], body: bytes) -> httpx.Response:
    return httpx.post(
        f"{base}/v1/events",
        headers={**headers, "authorization": f"Bearer {key}"},
        content=body,
        timeout=10,
    )


def stored(db: Any, event_id: str) -> tuple[Any, ...]:
    row = db.execute(
        "SELECT type, attributes, data, body_hash FROM events WHERE event_id = %s", (event_id,)
    ).fetchone()
    assert row is not None, f"event {event_id} not stored"
    return tuple(row)


@pytest.fixture
def key(make_key: Any) -> str:
    return make_key(tenant="acme", scope="ingest")


def test_structured_and_binary_modes_store_the_same_event(live_server, key, db):
    structured = to_structured(sdk_event("sdk-s"), JSONFormat())
    binary = to_binary(sdk_event("sdk-b"), JSONFormat())
    assert binary.headers.get("ce-id") == "sdk-b"
    for message in (structured, binary):
        reply = send(live_server, key, dict(message.headers), message.body)
        assert reply.status_code == 200, reply.text
        assert reply.json()["accepted"] == 1
    s_type, s_attrs, s_data, _ = stored(db, "sdk-s")
    b_type, b_attrs, b_data, _ = stored(db, "sdk-b")
    assert (s_type, s_data) == (b_type, b_data)
    assert {k: v for k, v in s_attrs.items() if k not in ("id", "time")} == {
        k: v for k, v in b_attrs.items() if k not in ("id", "time")
    }


def test_same_event_sent_structured_then_binary_is_a_duplicate(live_server, key, db):
    event = sdk_event("sdk-same")
    first = to_structured(event, JSONFormat())
    again = to_binary(event, JSONFormat())
    assert send(live_server, key, dict(first.headers), first.body).json()["accepted"] == 1
    reply = send(live_server, key, dict(again.headers), again.body)
    assert reply.status_code == 200, reply.text
    assert reply.json() == {
        "accepted": 0,
        "duplicates": 1,
        "events": [{"source": "agent-backend/eu-1", "id": "sdk-same", "result": "duplicate"}],
    }
    assert db.execute("SELECT count(*) FROM events").fetchone() == (1,)


def test_legacy_v1_sdk_api_is_accepted_in_both_modes(live_server, key, db):
    attributes = {
        "source": "agent-backend/eu-1",
        "type": "run.heartbeat",
        "subject": "legacy-run",
        "time": (datetime.now(UTC) - timedelta(seconds=2)).isoformat().replace("+00:00", "Z"),
    }
    for converter in (legacy_to_structured, legacy_to_binary):
        event = LegacyCloudEvent(attributes, {"customer": "cust-sdk"})
        headers, body = converter(event)
        reply = send(live_server, key, dict(headers), body)
        assert reply.status_code == 200, reply.text
        assert reply.json()["accepted"] == 1
    assert db.execute("SELECT count(*) FROM events WHERE type = 'run.heartbeat'").fetchone() == (2,)


def test_json_batch_format_is_accepted(live_server, key, db):
    fmt = JSONFormat()
    events = [json.loads(fmt.write(sdk_event(f"sdk-batch-{i}", step=i))) for i in range(5)]
    reply = send(
        live_server,
        key,
        {"content-type": "application/cloudevents-batch+json"},
        json.dumps(events).encode(),
    )
    assert reply.status_code == 200, reply.text
    assert reply.json()["accepted"] == 5
    gross = db.execute("SELECT sum(amount_micros) FROM ledger_entries").fetchone()[0]
    # agent-small-1: 4,000 × 0.25 + 800 × 1.25 USD/Mtok = 1,000 + 1,000 micros per event
    assert gross == 5 * 2_000
