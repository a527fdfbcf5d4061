"""Support's actions through the API tell the tenant, each once, in micro-USD, in order:
the action, then the re-settlement and the words that follow from it."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from metering.notifications import SCHEMA_VERSION
from metering.policy.status import (
    COMPLETED,
    COMPLETED_SUPPORT_CREDITED,
    FAILED_CHARGED,
    UNDER_REVIEW,
)
from metering.settlement.runner import settle_due_now
from tests.helpers.events import auth
from tests.helpers.ingest import ingest
from tests.helpers.scenarios import scenario

NOW = datetime.now(UTC)
START = NOW - timedelta(hours=3)
CLAIM = "The agent crashed half way; I had to run it again."


@pytest.fixture
def runs(engine, settings, db) -> int:
    """ok-run (confirmed, 1,750 micros billed) and held-run (held); the id of the last
    notification their ingest and settlement made."""
    events = scenario("completed", "ok-run", "cust-1", START) + scenario(
        "client-claim", "held-run", "cust-1", START
    )
    ingest(engine, settings, events)
    settle_due_now(engine, settings, now=NOW)
    return int(db.execute("SELECT max(id) FROM notifications").fetchone()[0])


def post(client: Any, key: str, path: str, body: dict[str, Any]) -> Any:
    reply = client.post(
        path, content=json.dumps(body), headers=auth(key, **{"content-type": "application/json"})
    )
    return reply


def since(db: Any, last: int, run: str) -> list[tuple[str, dict[str, Any]]]:
    rows = db.execute(
        "SELECT type, data FROM notifications WHERE id > %s AND subject = %s ORDER BY id",
        (last, run),
    ).fetchall()
    return [(r[0], r[1]) for r in rows]


def test_settlement_told_each_run_its_decision_and_the_hold(db, runs):
    assert [t for t, _ in since(db, 0, "ok-run")] == [
        "run.status_changed",
        "run.settled",
        "run.status_changed",
    ]
    held = since(db, 0, "held-run")
    assert [t for t, _ in held] == [
        "run.status_changed",
        "run.settled",
        "run.held",
        "run.status_changed",
    ]
    _, settled = held[1]
    assert settled["outcome"] == "held_for_review"
    assert settled["billed_micros"] == settled["credited_micros"] == 0
    assert settled["held_micros"] == settled["gross_micros"] > 0
    _, hold = held[2]
    assert hold["held_micros"] == settled["gross_micros"]
    assert held[3][1]["status"] == UNDER_REVIEW


def test_approved_dispute_credit_resettlement_words_and_resolution(client, make_key, db, runs):
    key = make_key(scope="support")
    reply = post(client, key, "/v1/support/runs/ok-run/disputes", {"claim": CLAIM})
    assert reply.status_code == 201, reply.text
    dispute = reply.json()["dispute_id"]
    reply = post(
        client,
        key,
        f"/v1/support/disputes/{dispute}/approve",
        {"amount_micros": 1_000, "reason": "Goodwill for the crash."},
    )
    assert reply.status_code == 200, reply.text
    told = since(db, runs, "ok-run")
    assert [t for t, _ in told] == [
        "dispute.opened",
        "credit.granted",
        "run.resettled",
        "run.status_changed",
        "dispute.resolved",
    ]
    opened, granted, resettled, words, resolved = (data for _, data in told)
    for data in (opened, granted, resettled, words, resolved):
        assert (data["schema_version"], data["run"], data["customer"]) == (
            SCHEMA_VERSION,
            "ok-run",
            "cust-1",
        )
    assert (opened["dispute"], opened["claim"]) == (dispute, CLAIM)
    assert (granted["amount_micros"], granted["dispute"]) == (1_000, dispute)
    assert granted["reason"] == "Goodwill for the crash."
    assert granted["by"] == opened["by"] == resolved["by"] != ""
    assert resettled["decision_version"] == 2 and resettled["previous_decision_version"] == 1
    assert resettled["origin"] == "support"
    assert resettled["changes"] == {
        "outcome": {"before": "confirmed", "after": "partially_credited"},
        "billed_micros": {"before": 1_750, "after": 750},
        "credited_micros": {"before": 0, "after": 1_000},
        "rule_ids": {"before": resettled["changes"]["rule_ids"]["before"], "after": ["R0", "S1"]},
    }
    assert (words["previous_status"], words["status"]) == (COMPLETED, COMPLETED_SUPPORT_CREDITED)
    assert (resolved["dispute"], resolved["resolution"], resolved["credit_micros"]) == (
        dispute,
        "approved",
        1_000,
    )


def test_rejected_dispute_is_resolved_without_money(client, make_key, db, runs):
    key = make_key(scope="support")
    dispute = post(client, key, "/v1/support/runs/ok-run/disputes", {"claim": CLAIM}).json()[
        "dispute_id"
    ]
    reply = post(
        client, key, f"/v1/support/disputes/{dispute}/reject", {"reason": "It was delivered."}
    )
    assert reply.status_code == 200, reply.text
    told = since(db, runs, "ok-run")
    assert [t for t, _ in told] == ["dispute.opened", "dispute.resolved"]
    resolved = told[1][1]
    assert (resolved["resolution"], resolved["credit_micros"], resolved["reason"]) == (
        "rejected",
        0,
        "It was delivered.",
    )


def test_releasing_a_hold_tells_released_then_the_new_decision(client, make_key, db, runs):
    key = make_key(scope="support")
    reply = post(client, key, "/v1/support/runs/held-run/release", {"reason": "Checked logs."})
    assert reply.status_code == 200, reply.text
    told = since(db, runs, "held-run")
    assert [t for t, _ in told] == ["run.released", "run.resettled", "run.status_changed"]
    released, resettled, words = (data for _, data in told)
    gross = resettled["gross_micros"]
    assert (released["held_micros"], released["reason"]) == (gross, "Checked logs.")
    assert resettled["changes"]["outcome"] == {"before": "held_for_review", "after": "confirmed"}
    assert resettled["changes"]["held_micros"] == {"before": gross, "after": 0}
    assert resettled["changes"]["billed_micros"] == {"before": 0, "after": gross}
    assert (words["previous_status"], words["status"]) == (UNDER_REVIEW, FAILED_CHARGED)


def test_a_direct_credit_on_a_held_run_releases_it_too(client, make_key, db, runs):
    key = make_key(scope="admin")
    reply = post(
        client, key, "/v1/support/runs/held-run/credit", {"full": True, "reason": "Refund."}
    )
    assert reply.status_code == 200, reply.text
    told = since(db, runs, "held-run")
    assert [t for t, _ in told] == [
        "credit.granted",
        "run.released",
        "run.resettled",
        "run.status_changed",
    ]
    granted = told[0][1]
    assert granted["dispute"] is None
    assert granted["amount_micros"] == told[2][1]["credited_micros"] > 0


def test_refused_actions_tell_nobody(client, make_key, db, runs):
    key = make_key(scope="support")
    too_much = post(
        client, key, "/v1/support/runs/ok-run/credit", {"amount_micros": 9_999, "reason": "x"}
    )
    assert too_much.status_code == 409, too_much.text
    not_held = post(client, key, "/v1/support/runs/ok-run/release", {"reason": "x"})
    assert not_held.status_code == 409, not_held.text
    empty_claim = post(client, key, "/v1/support/runs/ok-run/disputes", {"claim": " "})
    assert empty_claim.status_code == 422, empty_claim.text
    ingest_key = post(
        client, make_key(), "/v1/support/runs/ok-run/disputes", {"claim": "let me in"}
    )
    assert ingest_key.status_code == 403
    assert since(db, runs, "ok-run") == []
