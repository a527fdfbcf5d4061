"""Support credits are controlled money (issue #13 §2).

Limits are cumulative (per run, per customer per UTC day), credits on a run are serialised
and never take its credited amount above its gross, and a credit is of the usage the run
had when it was granted: usage arriving later is settled by policy, not by an old credit.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from freezegun import freeze_time

from metering.db import raw_transaction
from metering.disputes import service
from metering.keys import Principal, Scope
from metering.runs import find_run_id
from metering.settlement.runner import settle_due_now
from tests.helpers.events import auth, event, usage
from tests.helpers.ingest import ingest
from tests.security.harness import client_with, serve

NOW = datetime.now(UTC)
START = NOW - timedelta(hours=3)
USD = 1_000_000
REASONER_OUTPUT_MICROS_PER_TOKEN = 40  # agent-reasoner-2 output: 40 USD per million tokens


def at(minutes: float) -> datetime:
    return START + timedelta(minutes=minutes)


def reasoner_usage(
    *, run: str, customer: str, step: int, gross_micros: int, minute: float, **data: Any
) -> dict[str, Any]:
    """A usage line that costs exactly ``gross_micros``."""
    assert gross_micros % REASONER_OUTPUT_MICROS_PER_TOKEN == 0
    return usage(
        run=run,
        customer=customer,
        step=step,
        model="agent-reasoner-2",
        input_tokens=0,
        output_tokens=gross_micros // REASONER_OUTPUT_MICROS_PER_TOKEN,
        time=at(minute),
        **data,
    )


def completed_run(
    *, run: str, customer: str = "cust-1", gross_micros: int, **line: Any
) -> list[dict[str, Any]]:
    """A run that completed and delivered: the policy bills all of its one usage line."""

    def e(type_: str, minute: float, **data: Any) -> dict[str, Any]:
        return event(type=type_, run=run, customer=customer, time=at(minute), **data)

    return [
        e("run.started", 0, attempt=1),
        reasoner_usage(run=run, customer=customer, step=1, gross_micros=gross_micros, minute=1),
        e("run.delivered", 2.5, step=1, kind="final"),
        e("run.completed", 3),
    ]


def settle(engine: Any, settings: Any, events: list[dict[str, Any]]) -> None:
    ingest(engine, settings, events)
    settle_due_now(engine, settings, now=NOW)


def books(db: Any, run: str | None = None, customer: str | None = None) -> tuple[int, int, int]:
    """(gross, billed, credited) from the ledger itself, of a run or a customer's runs."""
    row = db.execute(
        """
        SELECT coalesce(sum(l.amount_micros) FILTER (WHERE l.kind = 'hold'), 0),
               coalesce(sum(l.amount_micros) FILTER (WHERE l.kind = 'post'
                                                     OR l.corrects = 'billed'), 0),
               coalesce(sum(l.amount_micros) FILTER (WHERE l.kind = 'release'
                                                     OR l.corrects = 'credited'), 0)
        FROM ledger_entries l JOIN runs r ON r.id = l.run_id
        WHERE (%(run)s::text IS NULL OR r.subject = %(run)s)
          AND (%(customer)s::text IS NULL OR r.customer_id = %(customer)s)
        """,
        {"run": run, "customer": customer},
    ).fetchone()
    return int(row[0]), int(row[1]), int(row[2])


def assert_balanced(db: Any, **where: str) -> None:
    """Every run here is settled and not held: gross = billed + credited, nothing held."""
    gross, billed, credited = books(db, **where)
    assert gross == billed + credited, (gross, billed, credited)
    assert billed >= 0 and credited >= 0


def credit(client: Any, key: str, run: str, **body: Any) -> Any:
    return client.post(
        f"/v1/support/runs/{run}/credit",
        content=json.dumps({"reason": "Goodwill for a slow run.", **body}),
        headers=auth(key, **{"content-type": "application/json"}),
    )


@pytest.fixture(scope="module")
def served_api(settings: Any, tmp_path_factory: Any) -> Iterator[str]:
    """The real API in its own process, answering requests concurrently on its thread pool.

    One process, not uvicorn's worker supervisor: on a loaded host that kills workers still
    importing after its 5 s health check, so the supervised server may never come up.
    """
    with serve(settings, tmp_path_factory.mktemp("credit-api")) as served:
        yield served.base


def test_split_support_credits_add_up_and_the_one_crossing_the_run_limit_needs_an_admin(
    client, make_key, engine, settings, db
):
    limit = settings.support_credit_limit_micros  # 50 USD
    settle(engine, settings, completed_run(run="big-run", gross_micros=200 * USD))
    support, admin = make_key(scope="support"), make_key(scope="admin")

    assert credit(client, support, "big-run", amount_micros=40 * USD).status_code == 200
    crossing = credit(client, support, "big-run", amount_micros=40 * USD)
    assert crossing.status_code == 403, crossing.text
    problem = crossing.json()
    assert problem["code"] == "credit_above_limit"
    assert problem["limit"] == "per_run"
    assert (problem["limit_micros"], problem["granted_micros"]) == (limit, 40 * USD)
    assert "need an admin key" in problem["detail"]
    assert books(db, run="big-run") == (200 * USD, 160 * USD, 40 * USD)  # nothing changed

    assert credit(client, support, "big-run", amount_micros=10 * USD).status_code == 200
    assert credit(client, support, "big-run", amount_micros=1).status_code == 403  # at 50
    assert credit(client, support, "big-run", percent="1").status_code == 403
    assert credit(client, admin, "big-run", amount_micros=40 * USD).status_code == 200
    assert books(db, run="big-run") == (200 * USD, 110 * USD, 90 * USD)
    granted = db.execute("SELECT count(*), sum(amount_micros) FROM support_credits").fetchone()
    assert granted == (3, 90 * USD)


def test_dispute_approvals_count_towards_the_same_run_limit(client, make_key, engine, settings, db):
    settle(engine, settings, completed_run(run="big-run", gross_micros=200 * USD))
    support = make_key(scope="support")
    assert credit(client, support, "big-run", amount_micros=30 * USD).status_code == 200
    opened = client.post(
        "/v1/support/runs/big-run/disputes",
        content=json.dumps({"claim": "It looped for an hour."}),
        headers=auth(support, **{"content-type": "application/json"}),
    )
    approve = client.post(
        f"/v1/support/disputes/{opened.json()['dispute_id']}/approve",
        content=json.dumps({"amount_micros": 30 * USD, "reason": "Looping."}),
        headers=auth(support, **{"content-type": "application/json"}),
    )
    assert approve.status_code == 403, approve.text
    assert approve.json()["limit"] == "per_run"
    assert db.execute("SELECT status FROM disputes").fetchone() == ("open",)
    assert books(db, run="big-run") == (200 * USD, 170 * USD, 30 * USD)


def test_support_credits_add_up_per_customer_per_utc_day(make_key, engine, settings, db):
    events = (
        completed_run(run="a-1", customer="cust-a", gross_micros=50 * USD)
        + completed_run(run="a-2", customer="cust-a", gross_micros=50 * USD)
        + completed_run(run="b-1", customer="cust-b", gross_micros=50 * USD)
    )
    settle(engine, settings, events)
    support = make_key(scope="support")
    today = NOW.replace(hour=12, minute=0, second=0, microsecond=0)
    tomorrow = today.replace(hour=0) + timedelta(days=1)

    with client_with(settings, support_credit_customer_daily_limit_micros=60 * USD) as client:
        with freeze_time(today):
            assert credit(client, support, "a-1", amount_micros=40 * USD).status_code == 200
            crossing = credit(client, support, "a-2", amount_micros=30 * USD)
            # Another customer's credits are counted on their own.
            assert credit(client, support, "b-1", amount_micros=40 * USD).status_code == 200
        with freeze_time(tomorrow):
            next_day = credit(client, support, "a-2", amount_micros=30 * USD)

    assert crossing.status_code == 403, crossing.text
    problem = crossing.json()
    assert (problem["code"], problem["limit"]) == ("credit_above_limit", "per_customer_per_day")
    assert (problem["limit_micros"], problem["granted_micros"]) == (60 * USD, 40 * USD)
    assert next_day.status_code == 200, next_day.text
    assert books(db, customer="cust-a") == (100 * USD, 30 * USD, 70 * USD)
    assert books(db, customer="cust-b") == (50 * USD, 10 * USD, 40 * USD)


def test_a_credit_above_what_the_run_bills_is_refused_not_cut(
    client, make_key, engine, settings, db
):
    settle(engine, settings, completed_run(run="run-10", gross_micros=10 * USD))
    admin = make_key(scope="admin")
    assert credit(client, admin, "run-10", amount_micros=4 * USD).status_code == 200

    refused = credit(client, admin, "run-10", amount_micros=6 * USD + 1)
    assert refused.status_code == 409, refused.text
    problem = refused.json()
    assert problem["code"] == "credit_exceeds_gross"
    assert (problem["creditable_micros"], problem["credit_micros"]) == (6 * USD, 6 * USD + 1)
    assert books(db, run="run-10") == (10 * USD, 6 * USD, 4 * USD)

    assert credit(client, admin, "run-10", full=True).status_code == 200
    nothing_left = credit(client, admin, "run-10", percent="50")
    assert nothing_left.status_code == 409
    assert nothing_left.json()["code"] == "credit_exceeds_gross"
    assert books(db, run="run-10") == (10 * USD, 0, 10 * USD)


def test_eight_concurrent_full_credits_apply_exactly_once(
    served_api, make_key, engine, settings, db
):
    settle(engine, settings, completed_run(run="contested", gross_micros=10 * USD))
    admin = make_key(scope="admin")
    start = threading.Barrier(8)
    replies: list[httpx.Response] = []

    def full_credit() -> None:
        with httpx.Client(base_url=served_api, timeout=120) as http:
            start.wait()
            reply = http.post(
                "/v1/support/runs/contested/credit",
                json={"full": True, "reason": "Refund the whole run."},
                headers=auth(admin),
            )
        replies.append(reply)

    threads = [threading.Thread(target=full_credit) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=180)

    statuses = sorted(reply.status_code for reply in replies)
    assert statuses == [200] + [409] * 7, [r.text for r in replies]
    refused = [r.json() for r in replies if r.status_code == 409]
    assert {p["code"] for p in refused} == {"credit_exceeds_gross"}
    assert books(db, run="contested") == (10 * USD, 0, 10 * USD)
    granted = db.execute("SELECT count(*), sum(amount_micros) FROM support_credits").fetchone()
    assert granted == (1, 10 * USD)
    assert db.execute(
        "SELECT support_credit_micros FROM runs WHERE subject = 'contested'"
    ).fetchone() == (10 * USD,)
    assert db.execute("SELECT count(*) FROM audit_log WHERE action = 'run.credit'").fetchone() == (
        1,
    )

    # Usage that arrives after the credit is billed: the credit was of 10 USD, not more.
    late = reasoner_usage(
        run="contested", customer="cust-1", step=2, gross_micros=5 * USD, minute=2
    )
    settle(engine, settings, [late])
    assert books(db, run="contested") == (15 * USD, 5 * USD, 10 * USD)
    assert_balanced(db, customer="cust-1")


def test_late_usage_after_a_full_credit_is_settled_by_policy_not_by_the_old_credit(
    client, make_key, engine, settings, db
):
    """Support refunds a 10 USD run in full. Then evidence arrives late: the tool call
    line B repeated had completed before it (R1 now credits B), and a usage line C of 4 USD.
    Support's credit covered A and B only; with B credited by the policy it is left with A,
    so C is billed, not swallowed by what remains of the old credit."""
    run, customer = "late-run", "cust-1"
    line_a = reasoner_usage(
        run=run, customer=customer, step=1, gross_micros=5 * USD, minute=1, tool_call_id="tc-1"
    )
    line_b = reasoner_usage(
        run=run, customer=customer, step=2, gross_micros=5 * USD, minute=2, tool_call_id="tc-1"
    )
    settle(
        engine,
        settings,
        [
            event(type="run.started", run=run, customer=customer, time=at(0), attempt=1),
            line_a,
            line_b,
            event(
                type="run.delivered", run=run, customer=customer, time=at(2.8), step=2, kind="final"
            ),
            event(type="run.completed", run=run, customer=customer, time=at(3)),
        ],
    )
    assert books(db, run=run) == (10 * USD, 10 * USD, 0)
    reply = credit(client, make_key(scope="admin"), run, full=True)
    assert reply.status_code == 200, reply.text
    assert books(db, run=run) == (10 * USD, 0, 10 * USD)

    tool_call_done = event(
        type="run.tool_call",
        run=run,
        customer=customer,
        time=at(1.5),
        tool_call_id="tc-1",
        step=1,
        status="completed",
    )
    line_c = reasoner_usage(run=run, customer=customer, step=3, gross_micros=4 * USD, minute=2.5)
    settle(engine, settings, [tool_call_done, line_c])

    decision = db.execute(
        "SELECT d.rule_ids FROM decisions d JOIN runs r ON r.id = d.run_id "
        "AND d.version = r.decision_version WHERE r.subject = %s",
        (run,),
    ).fetchone()
    assert "R1" in decision[0]
    assert books(db, run=run) == (14 * USD, 4 * USD, 10 * USD)
    assert_balanced(db, run=run)


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, html[:500]
    return found.group(1)


@pytest.fixture
def console(client, make_key):
    """The TestClient signed in to the console with a support key."""
    login = client.get("/console/login")
    signed = client.post(
        "/console/login",
        data={"key": make_key(scope="support"), "csrf": _csrf(login.text), "next": "/console"},
        follow_redirects=False,
    )
    assert signed.status_code == 303, signed.text
    return client


def test_console_credits_obey_the_cumulative_run_limit(console, make_key, engine, settings, db):
    settle(engine, settings, completed_run(run="big-run", gross_micros=200 * USD))
    assert (
        credit(console, make_key(scope="support"), "big-run", amount_micros=40 * USD).status_code
        == 200
    )
    page = console.get("/console/runs/big-run")
    csrf = _csrf(page.text)
    console.post(
        "/console/runs/big-run/dispute",
        data={"csrf": csrf, "claim": "It looped.", "confirm": "yes", "expect": ""},
    )
    dispute_id = db.execute("SELECT id FROM disputes").fetchone()[0]
    form = {
        "csrf": csrf,
        "form": "approve",
        "dispute_id": str(dispute_id),
        "credit": "amount",
        "amount_usd": "20",
        "reason": "Looping.",
    }
    review = console.post("/console/runs/big-run/approve", data=form)
    assert review.status_code == 200
    assert "need an admin key" in review.text and "will be refused" in review.text
    expect = re.search(r'name="expect" value="([^"]*)"', review.text)
    assert expect
    confirmed = console.post(
        "/console/runs/big-run/approve", data={**form, "confirm": "yes", "expect": expect.group(1)}
    )
    assert confirmed.status_code == 403
    assert "Nothing was changed" in confirmed.text
    assert db.execute("SELECT status FROM disputes").fetchone() == ("open",)
    assert books(db, run="big-run") == (200 * USD, 160 * USD, 40 * USD)


def wait_for_a_lock_wait(db: Any, timeout_s: float = 60.0) -> None:
    """Until another transaction of this database waits on a lock."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        waiting = db.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        ).fetchone()[0]
        if waiting:
            return
        time.sleep(0.05)
    raise TimeoutError("no transaction started waiting on a lock")


def test_an_approval_meeting_a_console_review_of_the_same_dispute_waits_then_gets_a_409(
    served_api, make_key, engine, settings, db
):
    """The console reviews a credit with the run locked. An API approval of the same dispute
    meanwhile waits for the run before it locks the dispute, so when the reviewer confirms,
    nobody waits in a cycle: the review applies and the API gets a clear 409."""
    settle(engine, settings, completed_run(run="disputed", gross_micros=10 * USD))
    reviewer = Principal("acme", Scope.SUPPORT, "console-reviewer")
    with raw_transaction(engine) as conn:
        dispute_id = service.open_dispute(conn, reviewer, "disputed", "It stalled.")
    replies: list[httpx.Response] = []

    def approve_over_http() -> None:
        replies.append(
            httpx.post(
                f"{served_api}/v1/support/disputes/{dispute_id}/approve",
                json={"amount_micros": 2 * USD, "reason": "From the API."},
                headers=auth(make_key(scope="support")),
                timeout=120,
            )
        )

    api = threading.Thread(target=approve_over_http)
    with raw_transaction(engine) as conn:
        run_id = find_run_id(conn, reviewer, "disputed")
        service.locked_run_money(conn, run_id)  # what the console's review does first
        api.start()
        wait_for_a_lock_wait(db)
        service.approve_dispute(
            conn,
            reviewer,
            dispute_id,
            service.Credit(amount_micros=3 * USD),
            reason="From the console.",
            settings=settings,
            now=datetime.now(UTC),
        )
    api.join(timeout=120)

    assert [r.status_code for r in replies] == [409], [r.text for r in replies]
    assert replies[0].json()["code"] == "dispute_resolved"
    assert books(db, run="disputed") == (10 * USD, 7 * USD, 3 * USD)
