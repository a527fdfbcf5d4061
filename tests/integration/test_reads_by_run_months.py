"""Settlement reads a run's events and usage lines from the months they can be in only
(``runs.first_received_at``), and never misses one, whatever order the clocks gave.

Each test works in one transaction it rolls back (it makes partitions for a past month).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from metering.config import Settings
from metering.history.partitions import month_start
from metering.ingest.service import IngestRequest, ingest_events
from metering.keys_repo import ensure_tenant
from metering.prices import CatalogCache, load_catalog
from metering.settlement.repo import LOAD_EVENTS, LOAD_USAGE, load_evidence
from tests.helpers.events import event, usage

NOW = datetime.now(UTC)
OLD = datetime(2026, 2, 10, 12, tzinfo=UTC)  # test prices start in January 2026


@pytest.fixture
def conn(db: psycopg.Connection[Any], database_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(database_url) as connection:
        ensure_tenant(connection, "acme")
        for table in ("events", "usage_lines"):
            first = month_start(OLD)
            connection.execute(
                "SELECT fairmeter_ensure_month_partitions(%s, %s, %s)", (table, first, first)
            )
        yield connection
        connection.rollback()


def send(
    conn: psycopg.Connection[Any], settings: Settings, events: list[dict[str, Any]], at: datetime
) -> None:
    lenient = settings.model_copy(update={"max_event_age_s": 3 * 365 * 24 * 3600})
    catalog = load_catalog(conn)
    request = IngestRequest("acme", events, single=False, received_at=at)
    ingest_events(conn, request, lenient, CatalogCache(lambda: catalog))


def run_id(conn: psycopg.Connection[Any], subject: str) -> int:
    return int(conn.execute("SELECT id FROM runs WHERE subject = %s", (subject,)).fetchone()[0])


def partitions_read(conn: psycopg.Connection[Any], sql: str, ids: list[int]) -> set[str]:
    """The partitions a statement's plan actually scanned (run-time pruning included)."""
    (plan,) = conn.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", {"ids": ids}).fetchone()
    scanned: set[str] = set()

    def walk(node: dict[str, Any]) -> None:
        if "Relation Name" in node and node.get("Actual Loops", 0) > 0:
            scanned.add(node["Relation Name"])
        for child in node.get("Plans", []):
            walk(child)

    walk((plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"])
    return scanned


def test_a_recent_run_is_read_from_its_months_only(conn, settings):
    send(conn, settings, [usage(run="run-old", time=OLD - timedelta(minutes=1))], OLD)
    send(conn, settings, [usage(run="run-new")], datetime.now(UTC))
    new = run_id(conn, "run-new")
    this_month, old_month = f"y{NOW:%Y}m{NOW:%m}", f"y{OLD:%Y}m{OLD:%m}"
    unbounded = "SELECT * FROM events WHERE run_id = ANY(%(ids)s)"
    assert f"events_{old_month}" in partitions_read(conn, unbounded, [new])  # every month
    for sql, table in ((LOAD_EVENTS, "events"), (LOAD_USAGE, "usage_lines")):
        read = partitions_read(conn, sql, [new])
        assert f"{table}_{this_month}" in read
        assert f"{table}_{old_month}" not in read  # skipped: before the run's first event
    both = partitions_read(conn, LOAD_EVENTS, [new, run_id(conn, "run-old")])
    assert f"events_{old_month}" in both


def test_a_run_whose_events_arrive_with_an_earlier_clock_is_read_whole(conn, settings):
    # First stored now, then an event received (by another host's clock) months earlier:
    # the run's bound moves back with it, and settlement reads both.
    send(conn, settings, [usage(run="run-x", step=1)], datetime.now(UTC))
    send(
        conn,
        settings,
        [
            usage(run="run-x", step=2, time=OLD - timedelta(minutes=1)),
            event(type="run.completed", run="run-x", time=OLD),
        ],
        OLD,
    )
    x = run_id(conn, "run-x")
    assert conn.execute("SELECT first_received_at FROM runs WHERE id = %s", (x,)).fetchone() == (
        OLD,
    )
    evidence = load_evidence(conn, [x])
    assert sorted(line.step for line in evidence.usage[x]) == [1, 2]
    assert len(evidence.events[x]) == 3


def test_a_run_without_a_bound_is_read_from_every_month(conn, settings):
    send(conn, settings, [usage(run="run-y", time=OLD - timedelta(minutes=1))], OLD)
    y = run_id(conn, "run-y")
    # A run written outside ingest (an import, a bench) has no first_received_at.
    conn.execute("UPDATE runs SET first_received_at = NULL WHERE id = %s", (y,))
    evidence = load_evidence(conn, [y])
    assert len(evidence.usage[y]) == 1
