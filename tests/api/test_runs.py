"""GET /v1/runs/{run}: the status words of docs/policy.md and the tentative money of a live run."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from tests.helpers.events import BATCH, auth, event, usage

T0 = datetime.now(UTC) - timedelta(minutes=30)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def send(client: Any, key: str, *events: dict[str, Any]) -> None:
    reply = client.post("/v1/events", content=json.dumps(list(events)), headers=auth(key, **BATCH))
    assert reply.status_code == 200, reply.text


def status_of(client: Any, key: str, run: str = "run-1") -> dict[str, Any]:
    reply = client.get(f"/v1/runs/{run}", headers=auth(key))
    assert reply.status_code == 200, reply.text
    body: dict[str, Any] = reply.json()
    return body


def test_run_with_events_flowing_is_still_running_with_tentative_gross(client, make_key):
    key = make_key()
    send(
        client,
        key,
        event(type="run.started", time=at(0), attempt=1),
        usage(step=1, input_tokens=1000, output_tokens=500, time=at(1)),
        usage(step=2, input_tokens=2000, output_tokens=0, cached_input_tokens=10_000, time=at(2)),
    )
    run = status_of(client, key)
    assert run["status"] == "Agent still running"
    # 3,000 + 7,500 for step 1; 6,000 + 3,000 (cached at 0.30 USD/Mtok) for step 2
    assert run["gross_micros"] == 19_500
    assert run["billed_micros"] is None and run["credited_micros"] is None
    assert run["held_micros"] is None
    assert run["outcome"] is None
    assert run["event_counts"] == {"run.started": 1, "run.usage": 2}
    assert run["event_count"] == 3


def test_server_side_drop_shows_connection_interrupted_until_resume(client, make_key):
    key = make_key()
    send(
        client,
        key,
        usage(step=1, time=at(1)),
        event(type="connection.lost", side="server", reason="reset", time=at(2)),
    )
    assert status_of(client, key)["status"] == "Connection interrupted"
    send(client, key, event(type="run.resumed", attempt=2, from_checkpoint="ck1", time=at(3)))
    assert status_of(client, key)["status"] == "Resuming from checkpoint"
    send(client, key, usage(step=2, attempt=2, time=at(4)))
    run = status_of(client, key)
    assert run["status"] == "Agent still running"
    assert run["attempts"] == 2


def test_client_side_drop_shows_reconnecting_until_restored(client, make_key):
    key = make_key()
    send(
        client,
        key,
        usage(step=1, time=at(1)),
        event(type="connection.lost", side="client", reason="wifi", time=at(2)),
    )
    assert status_of(client, key)["status"] == "Reconnecting"
    send(client, key, event(type="connection.restored", side="client", time=at(3)))
    assert status_of(client, key)["status"] == "Agent still running"


def test_status_does_not_depend_on_arrival_order(client, make_key):
    key = make_key()
    send(client, key, event(type="run.resumed", attempt=2, time=at(3)))
    send(client, key, event(type="connection.lost", side="server", time=at(2)))
    assert status_of(client, key)["status"] == "Resuming from checkpoint"


def test_ended_run_awaits_settlement(client, make_key):
    key = make_key()
    send(client, key, usage(step=1, time=at(1)), event(type="run.completed", time=at(2)))
    run = status_of(client, key)
    assert run["status"] == "Finished — settling usage"
    assert run["terminal_at"] is not None


def test_unknown_run_is_404(client, make_key):
    reply = client.get("/v1/runs/nope", headers=auth(make_key()))
    assert reply.status_code == 404
