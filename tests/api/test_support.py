"""The support API: disputes, credits, holds, the audit log, and who may use them."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from metering.settlement.runner import settle_due_now
from tests.helpers.events import auth, event
from tests.helpers.ingest import ingest
from tests.helpers.scenarios import scenario

NOW = datetime.now(UTC)
START = NOW - timedelta(hours=3)


@pytest.fixture
def runs(engine, settings, db) -> None:
    """ok-run (confirmed, 1,750 micros billed), drop-run (refunded), held-run (held)."""
    events = (
        scenario("completed", "ok-run", "cust-1", START)
        + scenario("server-drop", "drop-run", "cust-1", START)
        + scenario("client-claim", "held-run", "cust-1", START)
    )
    ingest(engine, settings, events)
    settle_due_now(engine, settings, now=NOW)


def post(client: Any, key: str, path: str, body: dict[str, Any]) -> Any:
    return client.post(
        path, content=json.dumps(body), headers=auth(key, **{"content-type": "application/json"})
    )


def open_dispute(client: Any, key: str, run: str = "ok-run") -> int:
    reply = post(
        client,
        key,
        f"/v1/support/runs/{run}/disputes",
        {"claim": "The agent crashed half way; I had to run it again."},
    )
    assert reply.status_code == 201, reply.text
    return int(reply.json()["dispute_id"])


def money(db: Any, run: str) -> tuple[int, int]:
    row = db.execute(
        "SELECT coalesce(sum(amount_micros) FILTER (WHERE kind = 'post' OR corrects = 'billed'),"
        " 0), coalesce(sum(amount_micros) FILTER (WHERE kind = 'release' OR "
        "corrects = 'credited'), 0) FROM ledger_entries l JOIN runs r ON r.id = l.run_id "
        "WHERE r.subject = %s",
        (run,),
    ).fetchone()
    return int(row[0]), int(row[1])


def audit_actions(db: Any) -> list[str]:
    return [r[0] for r in db.execute("SELECT action FROM audit_log ORDER BY id").fetchall()]


def test_partial_credit_adds_a_version_an_audit_row_and_a_stripe_correction(
    client, make_key, db, runs
):
    key = make_key(scope="support")
    assert money(db, "ok-run") == (1_750, 0)
    dispute = open_dispute(client, key)
    reply = post(
        client,
        key,
        f"/v1/support/disputes/{dispute}/approve",
        {"amount_micros": 1_000, "reason": "Goodwill for the crash."},
    )
    assert reply.status_code == 200, reply.text
    run = reply.json()
    assert (run["billed_micros"], run["credited_micros"]) == (750, 1_000)
    assert run["outcome"] == "partially_credited"
    assert [d["origin"] for d in run["decisions"]] == ["policy", "support"]
    assert money(db, "ok-run") == (750, 1_000)
    assert audit_actions(db) == ["dispute.open", "dispute.approve"]
    before, after = db.execute(
        "SELECT before, after FROM audit_log WHERE action = 'dispute.approve'"
    ).fetchone()
    assert before["billed_micros"] == 1_750 and after["billed_micros"] == 750
    outbox = db.execute(
        "SELECT o.decision_version, o.target_billed_micros FROM stripe_outbox o JOIN runs r "
        "ON r.id = o.run_id WHERE r.subject = 'ok-run' ORDER BY decision_version"
    ).fetchall()
    assert outbox == [(1, 1_750), (2, 750)]
    status = db.execute("SELECT status, credit_micros FROM disputes").fetchone()
    assert status == ("approved", 1_000)


def test_percent_and_full_credits(client, make_key, db, runs):
    key = make_key(scope="support")
    run = post(
        client, key, "/v1/support/runs/ok-run/credit", {"percent": "10", "reason": "Slow run."}
    ).json()
    assert run["credited_micros"] == 175
    run = post(
        client, key, "/v1/support/runs/ok-run/credit", {"full": True, "reason": "Refund all."}
    ).json()
    assert (run["billed_micros"], run["credited_micros"], run["outcome"]) == (0, 1_750, "refunded")


def test_rejected_dispute_changes_no_money(client, make_key, db, runs):
    key = make_key(scope="support")
    dispute = open_dispute(client, key)
    ledger_before = db.execute("SELECT count(*) FROM ledger_entries").fetchone()
    reply = post(
        client,
        key,
        f"/v1/support/disputes/{dispute}/reject",
        {"reason": "The run completed and its output was delivered."},
    )
    assert reply.status_code == 200
    assert [d["version"] for d in reply.json()["decisions"]] == [1]
    assert db.execute("SELECT count(*) FROM ledger_entries").fetchone() == ledger_before
    assert audit_actions(db) == ["dispute.open", "dispute.reject"]
    again = post(client, key, f"/v1/support/disputes/{dispute}/reject", {"reason": "again"})
    assert again.status_code == 409


def test_credit_above_the_support_limit_needs_an_admin(client, make_key, settings, db, runs):
    limit = settings.support_credit_limit_micros
    support, admin = make_key(scope="support"), make_key(scope="admin")
    ingest_big_run(client, make_key, limit)
    body = {"amount_micros": limit + 1, "reason": "Large refund."}
    denied = post(client, support, "/v1/support/runs/big-run/credit", body)
    assert denied.status_code == 403
    assert denied.json()["code"] == "credit_above_limit"
    assert money(db, "big-run")[1] == 0
    at_limit = post(
        client,
        support,
        "/v1/support/runs/big-run/credit",
        {"amount_micros": limit, "reason": "Within the limit."},
    )
    assert at_limit.status_code == 200
    allowed = post(client, admin, "/v1/support/runs/big-run/credit", body)
    assert allowed.status_code == 200
    assert allowed.json()["credited_micros"] == 2 * limit + 1


def ingest_big_run(client: Any, make_key: Any, limit: int) -> None:
    """A completed run billing more than ``limit`` (reasoner model, many output tokens)."""
    from tests.helpers.events import BATCH, usage

    tokens = limit // 10  # agent-reasoner-2 output at 40 USD/Mtok: bills 4 × the limit
    events = [
        usage(
            run="big-run",
            customer="cust-1",
            step=1,
            model="agent-reasoner-2",
            input_tokens=0,
            output_tokens=tokens,
            time=START,
        ),
        event(
            run="big-run",
            customer="cust-1",
            type="run.completed",
            time=START + timedelta(minutes=1),
        ),
    ]
    reply = client.post("/v1/events", content=json.dumps(events), headers=auth(make_key(), **BATCH))
    assert reply.status_code == 200, reply.text
    settle = client.post("/v1/support/runs/big-run/settle", headers=auth(make_key(scope="admin")))
    assert settle.json()["billed_micros"] > limit


def test_a_failure_mid_way_leaves_neither_credit_nor_audit_row(client, make_key, db, runs):
    key = make_key(scope="support")
    db.execute("""
        CREATE FUNCTION test_fail_audit() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'audit storage failed'; END; $$;
        CREATE TRIGGER test_fail_audit BEFORE INSERT ON audit_log
        FOR EACH ROW EXECUTE FUNCTION test_fail_audit();
    """)
    try:
        reply = post(
            client,
            key,
            "/v1/support/runs/ok-run/credit",
            {"amount_micros": 500, "reason": "Goodwill."},
        )
        assert reply.status_code == 500
    finally:
        db.execute("DROP TRIGGER test_fail_audit ON audit_log; DROP FUNCTION test_fail_audit()")
    assert money(db, "ok-run") == (1_750, 0)
    assert db.execute(
        "SELECT count(*) FROM decisions d JOIN runs r ON r.id = d.run_id WHERE r.subject = 'ok-run'"
    ).fetchone() == (1,)
    assert db.execute("SELECT count(*) FROM audit_log").fetchone() == (0,)
    assert db.execute(
        "SELECT support_credit_micros FROM runs WHERE subject = 'ok-run'"
    ).fetchone() == (0,)


def test_held_run_is_released_or_credited(client, make_key, db, runs):
    key = make_key(scope="support")
    held = client.get("/v1/runs/held-run", headers=auth(key)).json()
    assert held["outcome"] == "held_for_review" and money(db, "held-run") == (0, 0)
    queue = client.get("/v1/support/runs", params={"queue": "true"}, headers=auth(key)).json()
    assert [r["run"] for r in queue] == ["held-run"]
    run = post(client, key, "/v1/support/runs/held-run/release", {"reason": "Checked logs."}).json()
    assert run["outcome"] == "confirmed" and run["status"] == "Run failed — charged"
    assert money(db, "held-run") == (1_750, 0)
    assert client.get("/v1/support/runs", params={"queue": "true"}, headers=auth(key)).json() == []


def test_support_credit_survives_late_evidence(client, make_key, engine, settings, db, runs):
    key = make_key(scope="support")
    post(client, key, "/v1/support/runs/ok-run/credit", {"amount_micros": 700, "reason": "x"})
    ingest(
        engine,
        settings,
        [
            event(
                type="run.heartbeat",
                run="ok-run",
                customer="cust-1",
                time=START + timedelta(minutes=2.7),
            )
        ],
    )
    settle_due_now(engine, settings, now=NOW)
    assert money(db, "ok-run") == (1_050, 700)


def test_timeline_shows_events_with_sides_decisions_ledger_and_stripe(client, make_key, runs):
    body = client.get("/v1/support/runs/drop-run", headers=auth(make_key(scope="support"))).json()
    types = [(e["type"], e["side"]) for e in body["events"]]
    assert ("connection.lost", "server") in types and ("run.failed", "server") in types
    assert [e["time"] for e in body["events"]] == sorted(e["time"] for e in body["events"])
    assert body["run"]["outcome"] == "refunded"
    assert {line["kind"] for line in body["ledger"]} == {"hold", "release"}
    assert body["stripe"] == []  # a refunded run bills nothing


def test_access_matrix(client, make_key, runs):
    customer = make_key(scope="customer", customer="cust-1")
    for path in (
        "/v1/support/runs",
        "/v1/support/runs/ok-run",
        "/v1/support/audit",
        "/v1/support/disputes",
    ):
        assert client.get(path, headers=auth(customer)).status_code == 403
        assert client.get(path, headers=auth(make_key(scope="ingest"))).status_code == 403
    other_tenant = make_key(tenant="globex", scope="support")
    assert client.get("/v1/support/runs/ok-run", headers=auth(other_tenant)).status_code == 404
    assert client.get("/v1/support/runs", headers=auth(other_tenant)).json() == []


def test_bad_credit_requests_are_422(client, make_key, runs):
    key = make_key(scope="support")
    for body in (
        {"reason": "none chosen"},
        {"full": True, "amount_micros": 5, "reason": "two"},
        {"percent": "150", "reason": "x"},
        {"amount_micros": -5, "reason": "x"},
    ):
        reply = post(client, key, "/v1/support/runs/ok-run/credit", body)
        assert reply.status_code == 422, (body, reply.text)
    unknown = post(
        client, key, "/v1/support/runs/ok-run/credit", {"full": True, "reason": "x", "surprise": 1}
    )
    assert unknown.status_code == 400


def test_cli_credits_a_run_and_lists_disputes(client, make_key, settings, db, runs):
    import subprocess
    import sys

    from tests.helpers import ROOT
    from tests.helpers.processes import service_env

    open_dispute(client, make_key(scope="support"))

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "cli", "support", *args],
            cwd=ROOT,
            env=service_env(settings),
            capture_output=True,
            text=True,
            timeout=60,
        )

    done = cli("credit", "ok-run", "--tenant", "acme", "--amount", "0.0005", "--reason", "Sorry")
    assert done.returncode == 0, done.stderr
    assert money(db, "ok-run") == (1_250, 500)
    listed = cli("disputes", "--tenant", "acme", "--open")
    assert "ok-run" in listed.stdout and "1 dispute(s)" in listed.stdout
    shown = cli("run", "ok-run", "--tenant", "acme")
    assert json.loads(shown.stdout)["run"]["credited_micros"] == 500


def test_releasing_a_held_run_audits_the_ledger_position_and_explains_the_release(
    client, make_key, db, runs
):
    key = make_key(scope="support")
    run = post(client, key, "/v1/support/runs/held-run/release", {"reason": "Checked logs."}).json()
    before, after = db.execute(
        "SELECT before, after FROM audit_log WHERE action = 'run.release'"
    ).fetchone()
    # Held, nothing was billed: the policy's figure is a proposal, and says so.
    assert (before["billed_micros"], before["held_micros"]) == (0, 1_750)
    assert before["proposed_billed_micros"] == 1_750
    assert (after["billed_micros"], after["held_micros"]) == (1_750, 0)
    assert "held for review" not in run["explanation"]
    assert run["explanation"].endswith(
        "Support reviewed the run and released the hold. All 0.00175 USD of usage is billed."
    )
