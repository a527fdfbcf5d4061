"""Settled runs through the API: status words, money, history; support's settle-now."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

from tests.helpers import ROOT
from tests.helpers.events import BATCH, auth, event, usage
from tests.helpers.processes import service_env

T0 = datetime.now(UTC) - timedelta(hours=2)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def send(client: Any, key: str, *events: dict[str, Any]) -> None:
    reply = client.post("/v1/events", content=json.dumps(list(events)), headers=auth(key, **BATCH))
    assert reply.status_code == 200, reply.text


def settle_now(client: Any, key: str, run: str = "run-1") -> Any:
    return client.post(f"/v1/support/runs/{run}/settle", headers=auth(key))


def test_support_settles_a_refunded_run_and_everyone_sees_the_words(client, make_key):
    ingest_key, support_key = make_key(), make_key(scope="support")
    send(
        client,
        ingest_key,
        usage(step=1, time=at(1)),
        event(type="connection.lost", side="server", time=at(2)),
        event(type="run.failed", cause="network", time=at(3)),
    )
    reply = settle_now(client, support_key)
    assert reply.status_code == 200, reply.text
    run = reply.json()
    assert run["status"] == "Run failed — usage restored"
    assert (run["outcome"], run["billed_micros"], run["credited_micros"]) == ("refunded", 0, 10_500)
    assert "R4" in run["rule_ids"]
    assert run["explanation"].endswith("the full 0.0105 USD was restored.")
    assert [d["version"] for d in run["decisions"]] == [1]
    customer_view = client.get(
        "/v1/runs/run-1", headers=auth(make_key(scope="customer", customer="cust-1"))
    )
    assert customer_view.json()["status"] == "Run failed — usage restored"


def test_settle_now_settles_a_live_run_as_abandoned(client, make_key):
    ingest_key, support_key = make_key(), make_key(scope="support")
    send(client, ingest_key, usage(step=1, time=at(1)))
    run = settle_now(client, support_key).json()
    assert run["settled"] is True
    assert run["outcome"] == "held_for_review"  # no terminal event, no verified interruption
    assert run["status"] == "Under review"
    # Nothing is billed while held: the run shows the ledger's position, like statements do,
    # and the policy's provisional split stays in the decision history.
    assert (run["billed_micros"], run["credited_micros"]) == (0, 0)
    assert run["held_micros"] == run["gross_micros"] > 0
    assert run["decisions"][0]["billed_micros"] == run["gross_micros"]


def test_late_event_marks_the_run_reopened_until_resettled(client, make_key):
    ingest_key, support_key = make_key(), make_key(scope="support")
    send(
        client,
        ingest_key,
        usage(step=1, time=at(1)),
        event(type="run.failed", cause="server", time=at(2)),
    )
    assert settle_now(client, support_key).json()["outcome"] == "refunded"
    send(client, ingest_key, event(type="run.delivered", step=1, kind="final", time=at(1.5)))
    assert client.get("/v1/runs/run-1", headers=auth(support_key)).json()["reopened"] is True
    run = settle_now(client, support_key).json()
    assert run["reopened"] is False
    assert [d["outcome"] for d in run["decisions"]] == ["refunded", "confirmed"]
    assert run["status"] == "Run failed — charged"


def test_only_support_and_admin_may_settle(client, make_key):
    send(client, make_key(), usage(step=1, time=at(1)))
    assert settle_now(client, make_key()).status_code == 403
    assert settle_now(client, make_key(scope="customer", customer="cust-1")).status_code == 403
    assert settle_now(client, make_key(tenant="globex", scope="support")).status_code == 404
    assert settle_now(client, make_key(scope="admin")).status_code == 200


def test_cli_settles_due_runs(client, make_key, settings, db):
    send(client, make_key(), usage(step=1, time=at(1)), event(type="run.completed", time=at(2)))
    done = subprocess.run(
        [sys.executable, "-m", "cli", "settle", "--due"],
        cwd=ROOT,
        env=service_env(settings),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "1 run(s) decided" in done.stdout
    assert db.execute("SELECT outcome FROM runs").fetchone() == ("confirmed",)


def test_late_usage_is_held_and_tentative_so_a_reopened_run_always_adds_up(client, make_key):
    ingest_key, support_key = make_key(), make_key(scope="support")
    send(client, ingest_key, usage(step=1, time=at(1)))
    held = settle_now(client, support_key).json()
    assert held["outcome"] == "held_for_review"
    send(client, ingest_key, usage(step=2, time=at(2)))  # late usage after the decision
    for key in (support_key, make_key(scope="customer", customer="cust-1")):
        run = client.get("/v1/runs/run-1", headers=auth(key)).json()
        assert run["gross_micros"] == 2 * held["gross_micros"]
        assert (
            run["billed_micros"] + run["credited_micros"] + run["held_micros"]
            == (run["gross_micros"])
        )
        assert run["tentative_micros"] == held["gross_micros"]
        assert (run["reopened"], run["settled"]) == (True, False)
        assert run["status"] == "Late events arrived — settling again"
    resettled = settle_now(client, support_key).json()
    assert resettled["settled"] is True and resettled["tentative_micros"] == 0
    assert resettled["held_micros"] == resettled["gross_micros"]


def test_late_usage_after_a_refund_is_held_not_hidden(client, make_key):
    ingest_key, support_key = make_key(), make_key(scope="support")
    send(
        client,
        ingest_key,
        usage(step=1, time=at(1)),
        event(type="run.failed", cause="server", time=at(3)),
    )
    refunded = settle_now(client, support_key).json()
    send(client, ingest_key, usage(step=2, time=at(2)))
    run = client.get("/v1/runs/run-1", headers=auth(support_key)).json()
    assert (run["billed_micros"], run["credited_micros"]) == (0, refunded["gross_micros"])
    assert run["held_micros"] == run["tentative_micros"] == refunded["gross_micros"]
    assert (
        run["billed_micros"] + run["credited_micros"] + run["held_micros"] == (run["gross_micros"])
    )
