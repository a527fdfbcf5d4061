"""The append-only tables kept as monthly partitions (issue #18): made ahead, a row in its
month's partition, nothing refused when a month has none, and still append-only.

DDL is transactional in PostgreSQL: each test works in a transaction it rolls back, so the
partitions it makes far ahead do not stay in the shared test database.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from metering.history.partitions import (
    MONTHLY_TABLES,
    ensure_month_partitions,
    is_partition_of_monthly_table,
    month_start,
    months_after,
)
from reconciler.celery_app import app as celery_app

NOW = datetime.now(UTC)


@pytest.fixture
def conn(database_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(database_url) as connection:
        yield connection
        connection.rollback()


def partitions(conn: psycopg.Connection[Any], table: str) -> set[str]:
    rows = conn.execute(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = %s::regclass",
        (table,),
    ).fetchall()
    return {r[0] for r in rows}


def name(table: str, moment: datetime) -> str:
    return f"{table}_y{moment:%Y}m{moment:%m}"


def audit_row(conn: psycopg.Connection[Any], at: datetime) -> str:
    """Store an audit row at ``at``; the partition it went to."""
    (where,) = conn.execute(
        "INSERT INTO audit_log (tenant_id, actor, actor_scope, action, target_type, target_id, "
        "created_at) VALUES ('t', 'k', 'support', 'credit', 'run', 'r', %s) "
        "RETURNING tableoid::regclass::text",
        (at,),
    ).fetchone()
    return str(where)


def test_the_migrated_tables_are_partitioned_by_month_three_months_ahead(conn):
    for table in MONTHLY_TABLES:
        (strategy,) = conn.execute(
            "SELECT partstrat FROM pg_partitioned_table WHERE partrelid = %s::regclass", (table,)
        ).fetchone()
        assert strategy == "r"  # range
        made = partitions(conn, table)
        first = month_start(NOW)
        for ahead in range(4):
            month = months_after(first, ahead)
            assert f"{table}_y{month:%Y}m{month:%m}" in made
        assert f"{table}_default" in made
        assert all(is_partition_of_monthly_table(p) for p in made)
    assert not is_partition_of_monthly_table("audit_log")
    assert not is_partition_of_monthly_table("runs_y2026m01")
    assert not is_partition_of_monthly_table("event_keys")


def test_each_table_is_partitioned_by_its_server_set_time(conn):
    for table, column in MONTHLY_TABLES.items():
        (key,) = conn.execute("SELECT pg_get_partkeydef(%s::regclass)", (table,)).fetchone()
        assert key == f"RANGE ({column})"


def test_every_partition_of_every_monthly_table_is_append_only(conn):
    for table in MONTHLY_TABLES:
        for partition in partitions(conn, table) | {table}:
            (triggers,) = conn.execute(
                "SELECT count(*) FROM pg_trigger WHERE tgrelid = %s::regclass "
                "AND tgfoid = 'fairmeter_refuse_edit'::regproc",
                (partition,),
            ).fetchone()
            assert triggers == 1, partition


def test_the_beat_makes_what_is_missing_once_and_reports_what_exists(conn):
    later = NOW + timedelta(days=200)
    made = ensure_month_partitions(conn, later, ahead=3)
    first = month_start(later)
    months = [months_after(first, i) for i in range(4)]
    expected = [f"{t}_y{m:%Y}m{m:%m}" for t in MONTHLY_TABLES for m in months]
    assert [m.partition for m in made] == expected
    assert {m.outcome for m in made} == {"created"}
    again = ensure_month_partitions(conn, later, ahead=3)
    assert {m.outcome for m in again} == {"exists"}
    assert set(expected) <= set().union(*(partitions(conn, t) for t in MONTHLY_TABLES))


def test_a_row_goes_to_the_partition_of_its_month_in_utc(conn):
    start = datetime(NOW.year, NOW.month, 1, tzinfo=UTC)
    assert audit_row(conn, start) == name("audit_log", start)
    last_instant = start - timedelta(microseconds=1)
    ensure_month_partitions(conn, last_instant, ahead=0)
    assert audit_row(conn, last_instant) == name("audit_log", last_instant)


def test_a_row_of_a_month_without_partition_is_kept_and_that_month_is_reported_blocked(conn):
    far = NOW + timedelta(days=5 * 365)
    assert audit_row(conn, far) == "audit_log_default"
    made = ensure_month_partitions(conn, far, ahead=1)
    assert [m.outcome for m in made if m.table == "audit_log"] == ["blocked", "created"]
    assert {m.outcome for m in made if m.table != "audit_log"} == {"created"}
    assert conn.execute(
        "SELECT count(*) FROM audit_log WHERE created_at = %s", (far,)
    ).fetchone() == (1,)


def test_partitions_stay_append_only(conn):
    where = audit_row(conn, NOW)
    for target in ("audit_log", where):
        conn.execute("SAVEPOINT edit")
        with pytest.raises(psycopg.errors.RestrictViolation, match="append-only"):
            conn.execute(f"UPDATE {target} SET reason = 'changed'")
        conn.execute("ROLLBACK TO SAVEPOINT edit")
        with pytest.raises(psycopg.errors.RestrictViolation, match="append-only"):
            conn.execute(f"DELETE FROM {target}")
        conn.execute("ROLLBACK TO SAVEPOINT edit")


def test_the_beat_asks_a_worker_for_partitions_every_interval(settings):
    import reconciler.tasks  # noqa: F401  (registers the worker's tasks)

    entry = celery_app.conf.beat_schedule["ensure-partitions"]
    assert entry["task"] == "fairmeter.ensure_partitions" in celery_app.tasks
    assert entry["schedule"] == settings.partitions_interval_s
