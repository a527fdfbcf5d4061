"""Raw events leave after 13 months, and their keys stay (issue #18): an archived month of
events is gone from the database, its rows are in the Parquet file and come back equal, and
an event of that month sent again is still a duplicate, because ``event_keys`` is never
archived. A month with a run not yet settled stays. Real PostgreSQL, real files.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from metering.config import Settings
from metering.db import raw_transaction
from metering.errors import MeteringError
from metering.history import archive_db
from metering.history.archive import archive_history, restore_month
from metering.history.archive_plan import period_label
from metering.prices import PROVIDER_COSTS, insert_prices
from metering.pricing import Price, TokenClass
from metering.settlement.runner import settle_due_now
from tests.helpers.events import event, usage
from tests.helpers.ingest import ingest
from tests.integration import test_archive as base
from tests.integration.test_archive import (
    NOW,
    OLD,
    OLD_MONTH,
    RECENT,
    exists,
    make_months,
    outcomes,
    partition,
    rows_of,
)

# The archive tests' fixtures: an archive directory, settings with both retentions at 13
# months, and old partitions and bookkeeping cleaned before and after each test.
archive_dir = base.archive_dir
arch = base.arch
clean_history = base.clean_history

# A model priced since 2020 (the test catalog starts in 2026), only for these tests.
MODEL = "archive-test-model"
SINCE = datetime(2020, 1, 1, tzinfo=UTC)


@pytest.fixture(autouse=True)
def old_prices(engine: Any) -> None:
    with raw_transaction(engine) as conn:
        prices = [Price(MODEL, c, 1_000_000, SINCE) for c in TokenClass]
        insert_prices(conn, prices)
        insert_prices(conn, prices, PROVIDER_COSTS)


@pytest.fixture
def events_settings(arch: Settings) -> Settings:
    # Old events may be sent again here: the age limit of ingest is not what is under test.
    return arch.model_copy(update={"max_event_age_s": 3 * 365 * 24 * 3600})


def finished_run(run: str, at: datetime, *, customer: str = "cust-1") -> list[dict[str, Any]]:
    return [
        usage(id=f"{run}-u1", run=run, customer=customer, model=MODEL, time=at),
        usage(id=f"{run}-u2", run=run, customer=customer, model=MODEL, step=2, time=at),
        event(type="run.completed", id=f"{run}-done", run=run, customer=customer, time=at),
    ]


@pytest.fixture
def history(engine: Any, db: psycopg.Connection[Any], events_settings: Settings) -> Iterator[None]:
    """Two tenants' finished runs 15 months ago and 6 months ago, all settled."""
    make_months(db, OLD, RECENT)
    for tenant in ("acme", "other"):
        for run, received in (("run-old", OLD), ("run-recent", RECENT)):
            events = finished_run(run, received - timedelta(minutes=5))
            ingest(engine, events_settings, events, tenant=tenant, received_at=received)
    settle_due_now(engine, events_settings, NOW)
    assert db.execute(
        "SELECT count(*) FROM runs WHERE settled_evidence_version < evidence_version"
    ).fetchone() == (0,)
    yield


def event_keys(db: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return db.execute("SELECT * FROM event_keys ORDER BY 1, 2, 3").fetchall()


def test_an_old_month_of_events_leaves_and_its_events_stay_duplicates(
    engine, db, events_settings, history, archive_dir
):
    keys = event_keys(db)
    recent = {
        t: rows_of(db, partition(t, RECENT.date().replace(day=1)))
        for t in ("events", "usage_lines")
    }

    report = archive_history(engine, events_settings, NOW)

    assert outcomes(report)[("events", period_label(OLD_MONTH))] == "archived"
    assert not exists(db, partition("events", OLD_MONTH))
    assert (archive_dir / "events" / f"{period_label(OLD_MONTH)}.parquet").is_file()
    assert event_keys(db) == keys  # every key, the archived month's included
    for table, rows in recent.items():  # the months within retention are untouched
        assert rows_of(db, partition(table, RECENT.date().replace(day=1))) == rows

    for tenant in ("acme", "other"):
        again = ingest(
            engine,
            events_settings,
            finished_run("run-old", OLD - timedelta(minutes=5)),
            tenant=tenant,
        )
        assert (again.accepted, again.duplicates) == (0, 3)
    changed = usage(
        id="run-old-u1", run="run-old", model=MODEL, input_tokens=7, time=OLD - timedelta(minutes=5)
    )
    with pytest.raises(MeteringError) as conflict:
        ingest(engine, events_settings, [changed])
    assert conflict.value.status == 409
    assert not exists(db, partition("events", OLD_MONTH))


def old_decisions(db: psycopg.Connection[Any]) -> None:
    """The settled decisions again, as if decided 15 months ago (settlement stamps its own
    time; here it is only a column value): arrays, bytea and NULLs in the old month."""
    cols = [
        c.name for c in archive_db.columns(db, "decisions") if c.name not in ("id", "decided_at")
    ]
    names = ", ".join(cols)
    db.execute(
        f"INSERT INTO decisions ({names}, decided_at) SELECT {names}, %s FROM decisions",
        (OLD + timedelta(hours=1),),
    )


def test_a_restored_month_of_events_equals_what_was_archived(engine, db, events_settings, history):
    old_decisions(db)
    tables = ("events", "usage_lines", "decisions")
    before = {t: rows_of(db, partition(t, OLD_MONTH)) for t in tables}
    assert all(before.values())
    archive_history(engine, events_settings, NOW)
    assert not any(exists(db, partition(t, OLD_MONTH)) for t in tables)

    for table in tables:
        restore_month(engine, events_settings, table, OLD_MONTH, NOW)

    for table in tables:  # every column of every row: jsonb, bytea, times to the microsecond
        assert rows_of(db, partition(table, OLD_MONTH)) == before[table]


def test_a_run_not_yet_settled_holds_its_month(engine, db, events_settings, history):
    ingest(
        engine,
        events_settings,
        [usage(id="open-1", run="run-open", model=MODEL, time=OLD - timedelta(minutes=1))],
        received_at=OLD,
    )
    (run_id,) = db.execute("SELECT id FROM runs WHERE subject = 'run-open'").fetchone()

    report = archive_history(engine, events_settings, NOW)

    held = [o for o in report.outcomes if o.table == "events"]
    assert [o.outcome for o in held] == ["held"]
    assert f"acme/{run_id}" in held[0].detail
    assert exists(db, partition("events", OLD_MONTH))
    assert not any(a.table == "events" for a in archive_db.archived_months(db))
