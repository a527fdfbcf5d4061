"""``statement.closed``: once per (tenant, customer, month), when the statement has closed and
none of the customer's runs of the month still waits for a decision — even with two beats."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from freezegun import freeze_time

from metering.db import raw_transaction
from metering.notifications import SCHEMA_VERSION
from metering.settlement.settle import settle_runs
from metering.statements.closing import close_due_statements, close_statements
from metering.statements.query import StatementQuery
from metering.statements.totals import totals
from tests.helpers.ingest import ingest
from tests.helpers.scenarios import scenario

END = datetime(2026, 11, 30, 23, 0, tzinfo=UTC)  # the runs end in November
CLOSE = datetime(2026, 12, 2, 0, 0, tzinfo=UTC)  # the month's end + period_close_delay_s


def settle(engine: Any, settings: Any, db: Any, runs: list[str], now: datetime) -> None:
    ids = [
        r[0] for r in db.execute("SELECT id FROM runs WHERE subject = ANY(%s)", (runs,)).fetchall()
    ]
    with raw_transaction(engine) as conn:
        report = settle_runs(conn, ids, now=now, settings=settings, force=True)
    assert len(report.decided) == len(runs)


def closings(db: Any) -> list[tuple[str, str, dict[str, Any]]]:
    rows = db.execute(
        "SELECT tenant_id, customer_id, data FROM notifications "
        "WHERE type = 'statement.closed' ORDER BY id"
    ).fetchall()
    return [(r[0], r[1], r[2]) for r in rows]


def november(engine: Any, settings: Any, db: Any) -> None:
    """acme/c1: a confirmed, a refunded and a held run; acme/c2: a confirmed run settled and
    one that ended in November still waiting; globex/c1: a confirmed run."""
    start = END - timedelta(minutes=10)
    with freeze_time(END):
        ingest(
            engine,
            settings,
            scenario("completed", "a1", "c1", start)
            + scenario("server-drop", "a2", "c1", start)
            + scenario("client-claim", "a3", "c1", start)
            + scenario("completed", "b1", "c2", start)
            + scenario("server-drop", "b2", "c2", start),
        )
        ingest(engine, settings, scenario("completed", "g1", "c1", start), tenant="globex")
    settle(engine, settings, db, ["a1", "a2", "a3", "b1", "g1"], END + timedelta(minutes=5))


def test_announced_once_when_closed_and_nothing_of_the_month_is_pending(engine, settings, db):
    november(engine, settings, db)
    with freeze_time(CLOSE - timedelta(seconds=1)):
        assert close_due_statements(engine, settings) == 0  # still open
    with freeze_time(CLOSE):
        assert close_due_statements(engine, settings) == 2
        assert close_due_statements(engine, settings) == 0
    told = closings(db)
    assert [(tenant, customer) for tenant, customer, _ in told] == [
        ("acme", "c1"),
        ("globex", "c1"),
    ]
    with raw_transaction(engine) as conn:
        page = totals(conn, StatementQuery("acme", "c1", "2026-11"))
    data = told[0][2]
    assert data == {
        "schema_version": SCHEMA_VERSION,
        "customer": "c1",
        "period": "2026-11",
        "gross_micros": page.gross_micros,
        "billed_micros": page.billed_micros,
        "credited_micros": page.credited_micros,
        "held_micros": page.held_micros,
        "runs": 3,
        "closed_at": "2026-12-02T00:00:00.000000Z",
    }
    assert page.billed_micros > 0 and page.credited_micros > 0 and page.held_micros > 0
    assert page.gross_micros == page.billed_micros + page.credited_micros + page.held_micros
    # acme/c2's run b2 ended in November and waits for its decision: c2 waits with it.
    settle(engine, settings, db, ["b2"], CLOSE + timedelta(minutes=10))
    with freeze_time(CLOSE + timedelta(minutes=15)):
        assert close_due_statements(engine, settings) == 1
    last = closings(db)[-1]
    assert (last[0], last[1], last[2]["period"], last[2]["runs"]) == ("acme", "c2", "2026-11", 1)
    with freeze_time(CLOSE + timedelta(days=40)):  # December has closed too: b2 is on it
        assert close_due_statements(engine, settings) == 1
    assert closings(db)[-1][2]["period"] == "2026-12"
    assert db.execute("SELECT count(*) FROM statement_closings").fetchone() == (4,)


def test_two_beats_at_once_announce_each_statement_once(engine, settings, db):
    november(engine, settings, db)
    delay = timedelta(seconds=settings.period_close_delay_s)
    other: list[int] = []
    with freeze_time(CLOSE), raw_transaction(engine) as conn:
        assert len(close_statements(conn, CLOSE, delay=delay, lookback=3)) == 2
        # A second beat while the first has not committed: it waits for the first's rows…
        beat = threading.Thread(target=lambda: other.append(close_due_statements(engine, settings)))
        beat.start()
        time.sleep(1.0)
        assert beat.is_alive()
    beat.join(timeout=120)  # … and, once they are committed, closes nothing
    assert other == [0]
    assert len(closings(db)) == 2
    assert db.execute("SELECT count(*) FROM statement_closings").fetchone() == (2,)
