"""POST /v1/events: the happy paths and idempotency, through the real app and database."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from metering.prices import insert_prices
from metering.pricing import Price, TokenClass
from tests.helpers.events import BATCH, STRUCTURED, auth, event, usage


def post(client: Any, key: str, body: Any, headers: dict[str, str] = STRUCTURED) -> Any:
    return client.post("/v1/events", content=json.dumps(body), headers=auth(key, **headers))


def test_structured_usage_event_is_accepted_and_held_at_catalog_price(client, make_key, db):
    key = make_key()
    reply = post(client, key, usage(input_tokens=1000, output_tokens=500, id="u1"))
    assert reply.status_code == 200, reply.text
    assert reply.json() == {
        "accepted": 1,
        "duplicates": 0,
        "events": [{"source": "agent-backend/eu-1", "id": "u1", "result": "accepted"}],
    }
    # agent-large-1: 3 USD/Mtok input, 15 USD/Mtok output → 3,000 + 7,500 micros
    holds = db.execute("SELECT kind, amount_micros FROM ledger_entries").fetchall()
    assert holds == [("hold", 10_500)]


def test_usage_is_held_at_the_price_in_force_at_its_own_time(client, make_key, db):
    # A price change an hour ago, for a model of this test's own (prices outlive tests).
    now = datetime.now(UTC)
    old, new = now - timedelta(days=20), now - timedelta(hours=1)
    insert_prices(
        db,
        [
            Price("repriced-1", TokenClass.INPUT, 2_000_000, old),
            Price("repriced-1", TokenClass.CACHED_INPUT, 200_000, old),
            Price("repriced-1", TokenClass.OUTPUT, 8_000_000, old),
            Price("repriced-1", TokenClass.INPUT, 1_000_000, new),
            Price("repriced-1", TokenClass.CACHED_INPUT, 100_000, new),
            Price("repriced-1", TokenClass.OUTPUT, 4_000_000, new),
        ],
    )
    before = usage(model="repriced-1", id="before", time=now - timedelta(hours=1, seconds=1))
    after = usage(model="repriced-1", id="after", time=now - timedelta(minutes=59))
    reply = post(client, make_key(), [before, after], BATCH)
    assert reply.status_code == 200, reply.text
    holds = db.execute(
        "SELECT e.event_id, l.amount_micros FROM ledger_entries l "
        "JOIN usage_lines u ON u.id = l.usage_line_id JOIN events e ON e.id = u.event_pk "
        "ORDER BY e.event_id"
    ).fetchall()
    # 1,000 input + 500 output tokens: 2,000 + 4,000 before the change, 1,000 + 2,000 after.
    assert holds == [("after", 3_000), ("before", 6_000)]


def test_retried_event_is_counted_once_and_reported_as_duplicate(client, make_key, db):
    key = make_key()
    body = usage(id="u1")
    post(client, key, body)
    reply = post(client, key, body)
    assert reply.json()["duplicates"] == 1
    assert reply.json()["events"][0]["result"] == "duplicate"
    assert db.execute("SELECT count(*) FROM events").fetchone() == (1,)
    assert db.execute("SELECT count(*) FROM ledger_entries").fetchone() == (1,)


def test_batch_reports_each_event_and_counts_duplicates(client, make_key, db):
    key = make_key()
    first = usage(id="a")
    post(client, key, first)
    reply = post(client, key, [first, usage(id="b"), event(type="run.completed", id="c")], BATCH)
    assert reply.status_code == 200
    assert reply.json()["accepted"] == 2
    assert [e["result"] for e in reply.json()["events"]] == ["duplicate", "accepted", "accepted"]
