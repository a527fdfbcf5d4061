"""Customer usage statements: totals equal the ledger, CSV equals JSON, access, corrections."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from metering.settlement.runner import settle_due_now
from tests.helpers.events import auth, event
from tests.helpers.ingest import ingest
from tests.helpers.scenarios import KINDS, scenario

NOW = datetime.now(UTC)
PERIOD = NOW.strftime("%Y-%m")
MONTH_START = NOW.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def run_start(i: int) -> datetime:
    """Spread runs over the days of this month that have passed (at least an hour ago)."""
    span = max(NOW - timedelta(hours=2) - MONTH_START, timedelta(hours=1))
    return MONTH_START + span * (i / 20)


@pytest.fixture
def month(engine, settings, db) -> dict[str, str]:
    """Ten runs of customer cust-1 covering every outcome, settled; returns run → outcome."""
    expected = {}
    events: list[dict[str, Any]] = []
    for i, kind in enumerate(sorted(KINDS) * 2):
        run = f"run-{i:02d}"
        expected[run] = KINDS[kind]
        events += scenario(kind, run, "cust-1", run_start(i))
    events += scenario("completed", "other-customer-run", "cust-2", run_start(3))
    ingest(engine, settings, events)
    settle_due_now(engine, settings, now=NOW)
    return expected


def statement(
    client: Any, key: str, customer: str = "cust-1", period: str = PERIOD, **params: Any
) -> Any:
    return client.get(
        f"/v1/customers/{customer}/statements/{period}", params=params, headers=auth(key)
    )


def ledger_sums(db: Any, customer: str, period: str) -> tuple[int, int]:
    row = db.execute(
        """
        SELECT coalesce(sum(l.amount_micros) FILTER (WHERE l.kind = 'post'
                                                   OR l.corrects = 'billed'), 0),
               coalesce(sum(l.amount_micros) FILTER (WHERE l.kind = 'release'
                                                   OR l.corrects = 'credited'), 0)
        FROM ledger_entries l
        JOIN decisions d ON d.run_id = l.run_id AND d.version = l.decision_version
        WHERE l.customer_id = %s AND d.statement_period = %s
        """,
        (customer, period),
    ).fetchone()
    return int(row[0]), int(row[1])


def test_totals_equal_ledger_sums_and_lines_match_decisions(client, make_key, db, month):
    body = statement(client, make_key(scope="customer", customer="cust-1")).json()
    assert body["period"] == PERIOD
    lines = {line["run"]: line for line in body["lines"]}
    assert {run: line["outcome"] for run, line in lines.items()} == month
    billed, credited = ledger_sums(db, "cust-1", PERIOD)
    totals = body["totals"]
    assert (totals["billed_micros"], totals["credited_micros"]) == (billed, credited)
    holds = db.execute(
        "SELECT sum(amount_micros) FROM ledger_entries WHERE kind = 'hold' AND customer_id = %s",
        ("cust-1",),
    ).fetchone()[0]
    assert totals["gross_micros"] == holds
    assert totals["gross_micros"] == billed + credited + totals["held_micros"]
    assert totals["runs"] == 10
    assert totals["runs_restored"] == sum(1 for o in month.values() if o == "refunded")
    decisions = dict(
        db.execute(
            "SELECT r.subject, d.status || '|' || d.explanation FROM decisions d "
            "JOIN runs r ON r.id = d.run_id WHERE d.customer_id = 'cust-1'"
        ).fetchall()
    )
    for run, line in lines.items():
        assert f"{line['status']}|{line['explanation']}" == decisions[run]
        assert line["gross_micros"] > 0 and line["models"] == ["agent-small-1"]
    held = [line for line in lines.values() if line["outcome"] == "held_for_review"]
    assert held and all(line["billed_micros"] == 0 == line["credited_micros"] for line in held)


def test_csv_and_json_agree_line_by_line(client, make_key, month):
    key = make_key(scope="support")
    json_lines = statement(client, key).json()["lines"]
    reply = client.get(f"/v1/customers/cust-1/statements/{PERIOD}.csv", headers=auth(key))
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(reply.text)))
    assert len(rows) == len(json_lines) == 10
    for row, line in zip(rows, json_lines, strict=True):
        assert row["run"] == line["run"]
        for field in ("gross_micros", "billed_micros", "credited_micros", "input_tokens"):
            assert int(row[field]) == line[field]
        assert row["status"] == line["status"] and row["outcome"] == line["outcome"]
    by_accept = client.get(
        f"/v1/customers/cust-1/statements/{PERIOD}", headers=auth(key, accept="text/csv")
    )
    assert by_accept.text == reply.text


def test_pages_follow_the_cursor_and_filters_apply(client, make_key, month):
    key = make_key(scope="support")
    first = statement(client, key, limit=4).json()
    seen = [line["run"] for line in first["lines"]]
    cursor = first["next_cursor"]
    while cursor:
        page = statement(client, key, limit=4, cursor=cursor).json()
        seen += [line["run"] for line in page["lines"]]
        cursor = page["next_cursor"]
    assert sorted(seen) == sorted(month) and len(seen) == len(set(seen))
    refunded = statement(client, key, outcome="refunded").json()["lines"]
    assert {line["run"] for line in refunded} == {r for r, o in month.items() if o == "refunded"}
    assert statement(client, key, outcome="nonsense").status_code == 422
    assert statement(client, key, cursor="!!").status_code == 422
    assert statement(client, key, period="2026-13").status_code == 422
    current = statement(client, key, period="current").json()
    assert current["period"] == PERIOD


def test_tenancy_matrix(client, make_key, month):
    assert statement(client, make_key(scope="customer", customer="cust-2")).status_code == 404
    assert statement(client, make_key(scope="ingest")).status_code == 403
    assert statement(client, make_key(tenant="globex", scope="support")).status_code == 404
    assert statement(client, make_key(scope="admin")).status_code == 200
    assert statement(client, make_key(scope="support"), customer="nobody").status_code == 404


def test_late_correction_after_close_goes_to_the_next_statement(
    client, make_key, engine, settings, db, month
):
    key = make_key(scope="support")
    before_json = statement(client, key).content
    before_csv = client.get(f"/v1/customers/cust-1/statements/{PERIOD}.csv", headers=auth(key))
    refunded = next(run for run, outcome in sorted(month.items()) if outcome == "refunded")
    # Late evidence: the refunded run had delivered its first step.
    start = run_start(int(refunded.split("-")[1]))
    ingest(
        engine,
        settings,
        [
            event(
                type="run.delivered",
                run=refunded,
                customer="cust-1",
                step=1,
                kind="partial",
                time=start + timedelta(minutes=1.5),
            )
        ],
    )
    next_month = (MONTH_START + timedelta(days=32)).replace(day=1)
    after_close = next_month + timedelta(days=2)
    settle_due_now(engine, settings, now=after_close)
    assert statement(client, key).content == before_json
    after_csv = client.get(f"/v1/customers/cust-1/statements/{PERIOD}.csv", headers=auth(key))
    assert after_csv.content == before_csv.content
    later = statement(client, key, period=next_month.strftime("%Y-%m")).json()
    (line,) = later["lines"]
    assert (line["kind"], line["run"], line["corrects_period"]) == ("correction", refunded, PERIOD)
    assert line["billed_micros"] > 0 and line["credited_micros"] == -line["billed_micros"]
    assert later["totals"]["runs"] == 0 and later["totals"]["corrections"] == 1
    billed, credited = ledger_sums(db, "cust-1", next_month.strftime("%Y-%m"))
    assert (later["totals"]["billed_micros"], later["totals"]["credited_micros"]) == (
        billed,
        credited,
    )


def test_statement_shows_stripe_state(client, make_key, db, month):
    lines = statement(client, make_key(scope="support")).json()["lines"]
    states = {line["outcome"]: line["stripe"] for line in lines}
    # No customer has a Stripe id yet: billed runs wait for it; refunded ones bill nothing.
    assert states["confirmed"] == "waiting_customer"
    assert states["refunded"] == "not_billed"


def test_html_page_has_totals_chart_and_marked_runs(client, make_key, month):
    reply = client.get(
        f"/v1/customers/cust-1/statements/{PERIOD}.html",
        headers=auth(make_key(scope="customer", customer="cust-1")),
    )
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/html")
    html = reply.text
    assert 'id="total-billed"' in html and "daily-chart" in html
    assert html.count('class="bar billed"') == int(html.split('data-days="')[1].split('"')[0])
    assert 'data-outcome="refunded"' in html


def test_json_is_the_default_and_documented(client, make_key, month):
    reply = statement(client, make_key(scope="support"))
    assert reply.headers["content-type"].startswith("application/json")
    json.loads(reply.content)


def test_cli_prints_the_statement(month, settings):
    import subprocess
    import sys

    from tests.helpers import ROOT
    from tests.helpers.processes import service_env

    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "cli",
            "statement",
            "--tenant",
            "acme",
            "--customer",
            "cust-1",
            "--period",
            PERIOD,
        ],
        cwd=ROOT,
        env=service_env(settings),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)
    assert body["totals"]["runs"] == 10 and len(body["lines"]) == 10
    as_csv = subprocess.run(
        [
            sys.executable,
            "-m",
            "cli",
            "statement",
            "--tenant",
            "acme",
            "--customer",
            "cust-1",
            "--period",
            PERIOD,
            "--csv",
        ],
        cwd=ROOT,
        env=service_env(settings),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert as_csv.returncode == 0 and len(as_csv.stdout.strip().splitlines()) == 11


@pytest.mark.parametrize("suffix", [".html", ".csv"])
def test_statement_downloads_name_their_charset_once(client, make_key, month, suffix):
    key = make_key(scope="customer", customer="cust-1")
    reply = statement(client, key, period=PERIOD + suffix)
    assert reply.status_code == 200
    assert reply.headers["content-type"].count("charset") == 1, reply.headers["content-type"]


def documented_media_types(client: Any, path: str) -> set[str]:
    doc = client.get("/schema/openapi.json").json()
    return set(doc["paths"][path]["get"]["responses"]["200"]["content"])


def test_every_statement_representation_is_the_one_the_schema_documents(client, make_key, month):
    """The schema said application/json for the statement and its signed link, which answer
    CSV and HTML too: a client generated from it, or Schemathesis, read a page as wrong."""
    key = make_key(scope="support")
    documented = documented_media_types(client, "/v1/customers/{customer}/statements/{period}")
    for suffix in ("", ".csv", ".html"):
        reply = statement(client, key, period=f"{PERIOD}{suffix}")
        assert reply.status_code == 200
        assert reply.headers["content-type"].split(";")[0] in documented, suffix
    link = client.post(
        "/v1/support/customers/cust-1/statement-links", json={"period": PERIOD}, headers=auth(key)
    )
    assert link.status_code == 201, link.text
    page = client.get(link.json()["url"])
    assert page.status_code == 200
    assert page.headers["content-type"].split(";")[0] in documented_media_types(
        client, "/v1/statement-links/{token}"
    )
