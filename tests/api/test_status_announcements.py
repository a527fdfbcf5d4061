"""``run.status_changed`` from ingest: every change of the words a user sees, and only those.

Events go through ``POST /v1/events``; after each request the words announced so far must
end with what ``GET /v1/runs/{run}`` shows, each change exactly once, plain usage never.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from metering.notifications import SCHEMA_VERSION
from metering.policy.status import (
    AGENT_RUNNING,
    COMPLETED,
    CONNECTION_INTERRUPTED,
    RECONNECTING,
    RESETTLING,
    RESUMING,
    SETTLING,
    UNDER_REVIEW,
)
from metering.settlement.runner import settle_due_now
from tests.helpers.events import BATCH, auth, event, usage

T0 = datetime.now(UTC) - timedelta(hours=2)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def send(client: Any, key: str, *events: dict[str, Any]) -> dict[str, Any]:
    reply = client.post("/v1/events", content=json.dumps(list(events)), headers=auth(key, **BATCH))
    assert reply.status_code == 200, reply.text
    body: dict[str, Any] = reply.json()
    return body


def words(db: Any, run: str = "run-1") -> list[tuple[str | None, str]]:
    """(previous, new) of every ``run.status_changed`` for ``run``, in id order."""
    rows = db.execute(
        "SELECT data->>'previous_status', data->>'status' FROM notifications "
        "WHERE subject = %s AND type = 'run.status_changed' ORDER BY id",
        (run,),
    ).fetchall()
    return [(r[0], r[1]) for r in rows]


def shown(client: Any, key: str, run: str = "run-1") -> str:
    reply = client.get(f"/v1/runs/{run}", headers=auth(key))
    assert reply.status_code == 200, reply.text
    return str(reply.json()["status"])


def test_a_dropped_and_resumed_run_announces_each_change_once(
    client, make_key, db, engine, settings
):
    key, reader = make_key(), make_key(scope="support")
    steps: list[tuple[dict[str, Any], str | None]] = [  # an event, the words it brings
        (event(type="run.started", attempt=1, time=at(0)), AGENT_RUNNING),
        (usage(step=1, time=at(1)), None),
        (usage(step=2, time=at(2)), None),
        (event(type="connection.lost", side="server", time=at(3)), CONNECTION_INTERRUPTED),
        (event(type="connection.lost", side="server", time=at(3.5)), None),  # still down
        (event(type="run.resumed", attempt=2, from_checkpoint="ck1", time=at(4)), RESUMING),
        (usage(step=2, attempt=1, time=at(4.5)), None),  # the old attempt's usage, late
        (usage(step=3, attempt=2, time=at(5)), AGENT_RUNNING),
        (usage(step=4, attempt=2, time=at(6)), None),
        (event(type="connection.lost", side="client", time=at(7)), RECONNECTING),
        (event(type="connection.restored", side="client", time=at(8)), AGENT_RUNNING),
        (event(type="run.heartbeat", time=at(8.5)), None),
        (event(type="run.completed", time=at(9)), SETTLING),
        (usage(step=5, attempt=2, time=at(8.8)), None),  # late usage before settlement
    ]
    expected: list[str] = []
    for sent, brings in steps:
        send(client, key, sent)
        if brings is not None:
            expected.append(brings)
        assert [new for _, new in words(db)] == expected, sent["type"]
        assert shown(client, reader) == expected[-1]
    send(client, key, *(sent for sent, _ in steps))  # every event again: all duplicates
    settle_due_now(engine, settings, now=datetime.now(UTC))
    expected.append(COMPLETED)
    announced = words(db)
    assert [new for _, new in announced] == expected
    assert shown(client, reader) == COMPLETED
    # Each announcement names the words before it: one chain, nothing skipped.
    assert [old for old, _ in announced] == [None, *expected[:-1]]


def test_every_payload_names_its_run_customer_schema_and_time(client, make_key, db):
    key = make_key()
    send(client, key, usage(step=1, run="r-7", customer="cust-9", time=at(1)))
    row = db.execute(
        "SELECT tenant_id, customer_id, subject, run_id, data FROM notifications"
    ).fetchone()
    tenant, customer, subject, run_id, data = row
    assert (tenant, customer, subject) == ("acme", "cust-9", "r-7")
    assert run_id == db.execute("SELECT id FROM runs WHERE subject = 'r-7'").fetchone()[0]
    assert set(data) == {
        "schema_version",
        "run",
        "customer",
        "status",
        "previous_status",
        "changed_at",
    }
    assert (data["schema_version"], data["run"], data["customer"]) == (
        SCHEMA_VERSION,
        "r-7",
        "cust-9",
    )
    assert (data["status"], data["previous_status"]) == (AGENT_RUNNING, None)
    changed_at = datetime.fromisoformat(data["changed_at"].replace("Z", "+00:00"))
    assert abs(changed_at - datetime.now(UTC)) < timedelta(minutes=1)


def test_a_whole_run_in_one_request_announces_only_where_it_ends(client, make_key, db):
    key = make_key()
    send(
        client,
        key,
        event(type="run.started", time=at(0)),
        event(type="connection.lost", side="server", time=at(1)),
        event(type="run.failed", cause="network", time=at(2)),
    )
    assert words(db) == [(None, SETTLING)]


def test_words_follow_event_time_not_arrival_order(client, make_key, db):
    key = make_key()
    send(client, key, event(type="run.resumed", attempt=2, time=at(3)))
    send(client, key, event(type="connection.lost", side="server", time=at(2)))  # before it
    assert words(db) == [(None, RESUMING)]
    send(client, key, usage(step=1, attempt=2, time=at(2.5)))  # before the resume: no end
    assert words(db) == [(None, RESUMING)]
    send(client, key, usage(step=2, attempt=2, time=at(3)))  # same time as it: after it
    assert words(db) == [(None, RESUMING), (RESUMING, AGENT_RUNNING)]


def test_a_late_event_reopens_a_settled_run_and_its_resettlement_closes_it(
    client, make_key, db, engine, settings
):
    key, support = make_key(), make_key(scope="support")
    send(client, key, usage(step=1, time=at(1)), event(type="run.completed", time=at(2)))
    settle_due_now(engine, settings, now=datetime.now(UTC))
    send(client, key, event(type="run.delivered", step=1, kind="final", time=at(1.5)))
    send(client, key, event(type="run.heartbeat", time=at(1.6)))  # already settling again
    assert [new for _, new in words(db)] == [SETTLING, COMPLETED, RESETTLING]
    assert shown(client, support) == RESETTLING
    settle_due_now(engine, settings, now=datetime.now(UTC))
    assert [new for _, new in words(db)] == [SETTLING, COMPLETED, RESETTLING, COMPLETED]


def test_a_parked_run_stays_under_review_whatever_arrives(client, make_key, db):
    key = make_key()
    send(client, key, usage(step=1, time=at(1)))
    db.execute("UPDATE runs SET parked_at = now(), announced_status = %s", (UNDER_REVIEW,))
    send(client, key, event(type="connection.lost", side="server", time=at(2)))
    send(client, key, event(type="run.failed", cause="network", time=at(3)))
    assert words(db) == [(None, AGENT_RUNNING)]


def test_refused_requests_announce_nothing(client, make_key, db):
    key = make_key()
    first = event(type="connection.lost", side="server", id="e-1", run="run-1", time=at(1))
    send(client, key, first)
    conflicting = {**first, "data": {**first["data"], "side": "client"}}
    lost_again = event(type="connection.lost", side="client", run="run-2", time=at(1))
    reply = client.post(
        "/v1/events", content=json.dumps([lost_again, conflicting]), headers=auth(key, **BATCH)
    )
    assert reply.status_code == 409, reply.text
    mismatch = event(type="run.failed", cause="network", run="run-1", customer="cust-2")
    reply = client.post("/v1/events", content=json.dumps([mismatch]), headers=auth(key, **BATCH))
    assert reply.status_code == 422, reply.text
    assert db.execute("SELECT subject, data->>'status' FROM notifications").fetchall() == [
        ("run-1", CONNECTION_INTERRUPTED)
    ]


def test_two_tenants_same_run_id_each_told_about_their_own(client, make_key, db):
    acme, globex = make_key(tenant="acme"), make_key(tenant="globex")
    send(client, acme, usage(step=1, customer="c-a", time=at(1)))
    send(client, globex, event(type="connection.lost", side="server", customer="c-g"))
    send(client, acme, event(type="run.completed", customer="c-a", time=at(2)))
    rows = db.execute(
        "SELECT n.tenant_id, n.customer_id, n.data->>'customer', n.data->>'status', "
        "r.tenant_id, r.customer_id FROM notifications n JOIN runs r ON r.id = n.run_id "
        "ORDER BY n.id"
    ).fetchall()
    assert rows == [
        ("acme", "c-a", "c-a", AGENT_RUNNING, "acme", "c-a"),
        ("globex", "c-g", "c-g", CONNECTION_INTERRUPTED, "globex", "c-g"),
        ("acme", "c-a", "c-a", SETTLING, "acme", "c-a"),
    ]
