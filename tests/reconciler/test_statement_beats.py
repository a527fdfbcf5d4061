"""Two beats ask a real worker to close statements every second: each customer's statement
of last month is announced once, with the totals its statement shows."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from metering.db import raw_transaction
from metering.periods import period_of
from metering.settlement.settle import settle_runs
from metering.statements.query import StatementQuery
from metering.statements.totals import totals
from tests.helpers.ingest import ingest
from tests.helpers.processes import wait_until
from tests.helpers.scenarios import scenario

NOW = datetime.now(UTC)
MONTH_START = NOW.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
LAST_MONTH = period_of(MONTH_START - timedelta(minutes=1))


def test_last_months_statements_are_announced_once_each(statement_beats, engine, settings, db):
    start = MONTH_START - timedelta(minutes=30)  # the runs end in the last minutes of it
    for customer in ("c1", "c2", "c3"):
        ingest(
            engine,
            settings,
            scenario("completed", f"{customer}-a", customer, start)
            + scenario("server-drop", f"{customer}-b", customer, start),
        )
    ids = [r[0] for r in db.execute("SELECT id FROM runs").fetchall()]
    with raw_transaction(engine) as conn:  # settled while last month's statement was open
        settle_runs(conn, ids, now=MONTH_START - timedelta(minutes=1), settings=settings)

    def closed() -> int:
        return int(db.execute("SELECT count(*) FROM statement_closings").fetchone()[0])

    assert wait_until(lambda: closed() == 3, timeout_s=120), "the beats closed no statement"
    wait_until(lambda: False, timeout_s=5)  # ten more beats: nothing more to announce
    rows = db.execute(
        "SELECT customer_id, data FROM notifications WHERE type = 'statement.closed' "
        "ORDER BY customer_id"
    ).fetchall()
    assert [customer for customer, _ in rows] == ["c1", "c2", "c3"]
    for customer, data in rows:
        with raw_transaction(engine) as conn:
            shown = totals(conn, StatementQuery("acme", customer, LAST_MONTH))
        assert data["period"] == LAST_MONTH
        assert (data["gross_micros"], data["billed_micros"], data["credited_micros"]) == (
            shown.gross_micros,
            shown.billed_micros,
            shown.credited_micros,
        )
        assert data["held_micros"] == 0 and data["runs"] == 2
