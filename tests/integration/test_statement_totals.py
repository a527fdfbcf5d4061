"""A statement's kept sums (``statement_totals``) always equal its lines summed.

Settlement adds each new line minus the version it replaces; any sequence of decisions,
re-decisions, corrections on later statements, lines moving between days and outcomes
must leave the sums equal to the lines, for every filter a statement takes.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta
from typing import Any

import psycopg
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from devtools.bulk import settled_runs
from metering.migrate import upgrade
from metering.policy import OUTCOMES
from metering.statements.projection import LineChange, record_lines
from metering.statements.query import (
    TOTALS_OF_LINES,
    StatementQuery,
    daily_of_lines,
    params,
    totals_of,
)
from metering.statements.totals import daily, totals, totals_sql
from tests.helpers.services import drop_database, recreate_database, server_database_url

# One customer per tenant (the bulk loader names runs per tenant): the sums of one must
# never take the other's lines.
CUSTOMERS = (("acme", "c1"), ("globex", "c2"))
RUN_PERIOD = "2026-09"
PERIODS = ("2026-09", "2026-10", "2026-11")


def period_start(period: str) -> datetime:
    year, month = (int(part) for part in period.split("-"))
    return datetime(year, month, 1, tzinfo=UTC)


def seed(db: Any) -> list[tuple[int, str, str]]:
    """Two runs per customer, ended in RUN_PERIOD; (run id, tenant, customer)."""
    for tenant, customer in CUSTOMERS:
        settled_runs(db, tenant=tenant, customer=customer, count=2, period=RUN_PERIOD)
    rows = db.execute("SELECT id, tenant_id, customer_id FROM runs ORDER BY id").fetchall()
    return [(int(r[0]), str(r[1]), str(r[2])) for r in rows]


step = st.fixed_dictionaries(
    {
        "run": st.integers(0, 3),
        "statement": st.integers(0, 2),
        "ended_day": st.integers(1, 28),
        "decided_day": st.integers(1, 28),
        "outcome": st.sampled_from(sorted(OUTCOMES)),
        "gross": st.integers(0, 5_000_000),
        "billed_share": st.integers(0, 100),
        "credited_share": st.integers(0, 100),
    }
)


def change(runs: list[tuple[int, str, str]], version: int, s: dict[str, Any]) -> LineChange:
    run_id, tenant, customer = runs[s["run"]]
    gross = s["gross"]
    billed = gross * s["billed_share"] // 100
    credited = (gross - billed) * s["credited_share"] // 100
    ended = period_start(RUN_PERIOD) + timedelta(days=s["ended_day"] - 1, hours=s["run"])
    return LineChange(
        run_id=run_id,
        tenant_id=tenant,
        customer_id=customer,
        statement_period=PERIODS[s["statement"]],
        run_period=RUN_PERIOD,
        version=version,
        started_at=ended - timedelta(minutes=5),
        ended_at=ended,
        models=("agent-large-1",),
        input_tokens=1,
        cached_input_tokens=0,
        output_tokens=1,
        gross_micros=gross,
        billed_micros=billed,
        credited_micros=credited,
        outcome=s["outcome"],
        status="Completed",
        explanation="property test",
    )


def filters(tenant: str, customer: str, period: str) -> list[StatementQuery]:
    whole = StatementQuery(tenant, customer, period)
    days = [period_start(RUN_PERIOD) + timedelta(days=d) for d in (0, 4, 11, 20, 31)]
    return (
        [whole]
        + [StatementQuery(tenant, customer, period, outcome=o) for o in sorted(OUTCOMES)]
        + [
            StatementQuery(tenant, customer, period, ended_from=a, ended_to=b)
            for a, b in itertools.pairwise(days)
        ]
        + [StatementQuery(tenant, customer, period, ended_from=days[2])]
        + [StatementQuery(tenant, customer, period, ended_to=days[3], outcome="refunded")]
    )


def assert_sums_equal_lines(db: Any) -> None:
    for tenant, customer in CUSTOMERS:
        for period in PERIODS:
            for query in filters(tenant, customer, period):
                by_lines = totals_of(db.execute(TOTALS_OF_LINES, params(query)).fetchone())
                assert totals(db, query) == by_lines, query
                assert daily(db, query) == daily_of_lines(db, query), query


@hypothesis_settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=st.lists(step, min_size=1, max_size=12))
def test_sums_equal_lines_after_any_decisions(db, steps):
    db.execute("TRUNCATE statement_totals, statement_lines, decisions, runs CASCADE")
    runs = seed(db)
    versions: dict[int, int] = {}
    for s in steps:
        run_id = runs[s["run"]][0]
        versions[run_id] = versions.get(run_id, 1) + 1
        decided = period_start(PERIODS[s["statement"]]) + timedelta(days=s["decided_day"] - 1)
        record_lines(db, [change(runs, versions[run_id], s)], decided)
        assert_sums_equal_lines(db)


def test_a_line_decided_again_the_same_way_leaves_the_sums_as_they_were(db):
    runs = seed(db)
    s = {
        "run": 0,
        "statement": 0,
        "ended_day": 3,
        "decided_day": 4,
        "outcome": "refunded",
        "gross": 1000,
        "billed_share": 0,
        "credited_share": 100,
    }
    now = datetime(2026, 9, 4, tzinfo=UTC)
    record_lines(db, [change(runs, 2, s)], now)
    sums = "SELECT * FROM statement_totals ORDER BY 1, 2, 3, 4, 5, 6, 7"
    before = db.execute(sums).fetchall()
    record_lines(db, [change(runs, 3, s)], now)
    assert db.execute(sums).fetchall() == before
    assert_sums_equal_lines(db)


def test_a_filter_within_a_day_is_summed_over_the_lines(db):
    seed(db)
    noon = period_start(RUN_PERIOD) + timedelta(hours=12)
    query = StatementQuery("acme", "c1", RUN_PERIOD, ended_from=noon)
    sql, _ = totals_sql(query)
    assert "statement_lines" in sql
    by_lines = totals_of(db.execute(TOTALS_OF_LINES, params(query)).fetchone())
    assert totals(db, query) == by_lines


def test_a_statement_page_reads_the_sums_not_the_lines(db):
    seed(db)
    sql, values = totals_sql(StatementQuery("acme", "c1", RUN_PERIOD))
    plan = "\n".join(r[0] for r in db.execute("EXPLAIN " + sql, values).fetchall())
    assert "statement_totals" in plan and "statement_lines" not in plan


def test_the_migration_sums_the_lines_already_written():
    scratch = f"fairmeter_test_totals_{os.getpid()}"
    url = recreate_database(server_database_url(), scratch)
    try:
        upgrade(url, "0025")
        with psycopg.connect(url, autocommit=True) as conn:
            for tenant, customer in CUSTOMERS:
                settled_runs_before_0026(conn, tenant, customer)
            lines = conn.execute("SELECT count(*) FROM statement_lines").fetchone()
        upgrade(url)
        with psycopg.connect(url, autocommit=True) as conn:
            assert lines == (6,)
            assert_sums_equal_lines(conn)
            kept = conn.execute("SELECT sum(lines) FROM statement_totals").fetchone()
            assert kept == (6,)
    finally:
        drop_database(server_database_url(), scratch)


def settled_runs_before_0026(conn: psycopg.Connection[Any], tenant: str, customer: str) -> None:
    """``settled_runs`` as it wrote before 0026: lines only (its sums go to a stand-in)."""
    conn.execute(
        "CREATE TABLE statement_totals (tenant_id text, customer_id text, "
        "statement_period text, kind text, outcome text, ended_on date, charted_on date, "
        "gross_micros bigint, billed_micros bigint, credited_micros bigint, lines bigint)"
    )
    try:
        settled_runs(conn, tenant=tenant, customer=customer, count=3, period=RUN_PERIOD)
    finally:
        conn.execute("DROP TABLE statement_totals")


def test_days_are_utc_days(db):
    """A run that ended at 23:30 UTC is on that UTC day, whatever the session's zone."""
    runs = seed(db)
    db.execute("SET TIME ZONE 'America/Los_Angeles'")
    late = {
        "run": 1,
        "statement": 0,
        "ended_day": 9,
        "decided_day": 9,
        "outcome": "refunded",
        "gross": 700,
        "billed_share": 0,
        "credited_share": 100,
    }
    line = replace(change(runs, 2, late), ended_at=datetime(2026, 9, 9, 23, 30, tzinfo=UTC))
    record_lines(db, [line], datetime(2026, 9, 10, tzinfo=UTC))
    query = StatementQuery("acme", "c1", RUN_PERIOD, outcome="refunded")
    assert daily(db, query) == [(date(2026, 9, 9), 0, 700)]
    assert_sums_equal_lines(db)
