"""Months past retention leave for Parquet files and come back for an audit (issue #18,
metering/history/archive.py): real PostgreSQL, real files, no mocks.

The tests share the session's database; the partitions of old months they make, and the
archive's bookkeeping, are removed before and after each test. Both retentions are 13
months here, so every monthly table's old month is archived (seven years is the default).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from psycopg import sql

from cli.main import main
from metering.config import Settings, load_cli_settings
from metering.history import archive_db
from metering.history.archive import (
    archive_engine,
    archive_history,
    archive_listing,
    restore_month,
    write_month,
)
from metering.history.archive_files import ArchiveStore
from metering.history.archive_plan import SqlDigest, months_before, period_label
from metering.history.partitions import month_start, months_after
from tests.security.test_database_role import app_role  # noqa: F401  (the role, as deployed)

NOW = datetime.now(UTC)
OLD = months_before(NOW, 15).replace(hour=12)  # mid-month, far past 13 months
OLD_MONTH = month_start(OLD)
RECENT = months_before(NOW, 6)


@pytest.fixture
def archive_dir(tmp_path: Path) -> Path:
    return tmp_path / "archive"


@pytest.fixture
def arch(settings: Settings, archive_dir: Path) -> Settings:
    return settings.model_copy(
        update={
            "archive_url": str(archive_dir),
            "events_retention_months": 13,
            "history_retention_months": 13,
        }
    )


def drop_old_partitions(conn: psycopg.Connection[Any]) -> None:
    keep_from = months_after(month_start(NOW), -2)
    with conn.transaction():
        for part in archive_db.monthly_partitions(conn):
            if part.month < keep_from:
                archive_db.drop_partition(conn, part)
        conn.execute("DELETE FROM archived_months")


@pytest.fixture(autouse=True)
def clean_history(db: psycopg.Connection[Any]) -> Iterator[None]:
    drop_old_partitions(db)
    yield
    drop_old_partitions(db)


def make_months(db: psycopg.Connection[Any], *moments: datetime) -> None:
    """The monthly partitions of every monthly table for the months of ``moments``."""
    tables = [
        r[0]
        for r in db.execute(
            "SELECT relname FROM pg_class "
            "WHERE relkind = 'p' AND relnamespace = 'public'::regnamespace"
        ).fetchall()
    ]
    for moment in moments:
        for table in tables:
            db.execute(
                "SELECT fairmeter_ensure_month_partitions(%s, %s, %s)",
                (table, month_start(moment), month_start(moment)),
            )


def audit_rows(
    db: psycopg.Connection[Any], at: datetime, *, tenant: str = "acme", n: int = 3
) -> None:
    for i in range(n):
        db.execute(
            "INSERT INTO audit_log (tenant_id, actor, actor_scope, action, target_type, target_id, "
            "reason, before, after, created_at) VALUES (%s, 'key-1', 'support', 'credit', 'run', "
            "%s, %s, %s, NULL, %s)",
            (
                tenant,
                f"run-{i}",
                None if i == 0 else f"reason ''{i}'' é\n\t",
                psycopg.types.json.Jsonb({"amount_micros": i, "list": [1, None, "x"], "e": {}}),
                at + timedelta(microseconds=i, days=i),
            ),
        )


def partition(table: str, month: date) -> str:
    return f"{table}_y{month:%Y}m{month:%m}"


def exists(db: psycopg.Connection[Any], name: str) -> bool:
    return db.execute("SELECT to_regclass(%s) IS NOT NULL", (name,)).fetchone() == (True,)


def rows_of(db: psycopg.Connection[Any], relation: str) -> list[tuple[Any, ...]]:
    return db.execute(
        sql.SQL("SELECT * FROM {} ORDER BY 1, 2").format(sql.Identifier(relation))
    ).fetchall()


def outcomes(report: Any) -> dict[tuple[str, str], str]:
    return {(o.table, o.period): o.outcome for o in report.outcomes}


# --- the audit log: every step, on a table partitioned since 0023 ------------------------------


def test_an_old_month_is_written_read_back_and_dropped_and_restored_row_for_row(
    engine, db, arch, archive_dir
):
    make_months(db, OLD, RECENT)
    audit_rows(db, OLD)
    audit_rows(db, OLD, tenant="other", n=2)
    audit_rows(db, RECENT)
    old_part = partition("audit_log", OLD_MONTH)
    before = rows_of(db, old_part)
    recent_before = rows_of(db, partition("audit_log", month_start(RECENT)))

    report = archive_history(engine, arch, NOW)

    assert outcomes(report)[("audit_log", period_label(OLD_MONTH))] == "archived"
    assert not exists(db, old_part)
    assert (archive_dir / "audit_log" / f"{period_label(OLD_MONTH)}.parquet").is_file()
    assert (archive_dir / "audit_log" / f"{period_label(OLD_MONTH)}.json").is_file()
    assert not list(archive_dir.rglob("*.partial-*"))
    assert rows_of(db, partition("audit_log", month_start(RECENT))) == recent_before
    (record,) = [a for a in archive_db.archived_months(db) if a.table == "audit_log"]
    assert (record.rows, record.restored_at) == (5, None)

    restore_month(engine, arch, "audit_log", OLD_MONTH, NOW)

    assert rows_of(db, old_part) == before  # every column of every row, as it was
    (record,) = [a for a in archive_db.archived_months(db) if a.table == "audit_log"]
    assert record.restored_at is not None


def test_a_restored_month_leaves_again_only_after_it_equals_its_file(engine, db, arch, archive_dir):
    make_months(db, OLD)
    audit_rows(db, OLD)
    archive_history(engine, arch, NOW)
    restore_month(engine, arch, "audit_log", OLD_MONTH, NOW)
    data = archive_dir / "audit_log" / f"{period_label(OLD_MONTH)}.parquet"
    written = data.stat().st_mtime_ns

    kept = archive_history(engine, arch, NOW + timedelta(days=29))
    assert outcomes(kept)[("audit_log", period_label(OLD_MONTH))] == "restored"  # its audit
    assert exists(db, partition("audit_log", OLD_MONTH))

    again = archive_history(engine, arch, NOW + timedelta(days=31))

    assert outcomes(again)[("audit_log", period_label(OLD_MONTH))] == "archived"
    assert data.stat().st_mtime_ns == written  # verified, not written again
    assert not exists(db, partition("audit_log", OLD_MONTH))
    (record,) = [a for a in archive_db.archived_months(db) if a.table == "audit_log"]
    assert record.restored_at is None


def test_a_restored_month_that_differs_from_its_file_stays(engine, db, arch):
    make_months(db, OLD)
    audit_rows(db, OLD)
    archive_history(engine, arch, NOW)
    restore_month(engine, arch, "audit_log", OLD_MONTH, NOW)
    audit_rows(db, OLD, n=1)  # a row added to the month while it was back

    report = archive_history(engine, arch, NOW + timedelta(days=31))

    (outcome,) = [o for o in report.outcomes if o.table == "audit_log"]
    assert outcome.outcome == "failed" and "nothing is dropped" in outcome.detail
    assert len(rows_of(db, partition("audit_log", OLD_MONTH))) == 4


def test_a_crash_after_the_file_was_written_is_finished_by_the_next_run(engine, db, arch):
    make_months(db, OLD)
    audit_rows(db, OLD)
    old = next(
        p for p in archive_db.monthly_partitions(db) if p.name == partition("audit_log", OLD_MONTH)
    )
    store = ArchiveStore(str(arch.archive_url))
    cols = archive_db.columns(db, old.name)
    write_month(engine, store, old, cols, NOW)  # what a run killed after writing had done
    assert exists(db, old.name)

    report = archive_history(engine, arch, NOW)

    assert outcomes(report)[("audit_log", period_label(OLD_MONTH))] == "archived"
    assert not exists(db, old.name)


@pytest.mark.parametrize("damage", ["truncated", "other rows"])
def test_a_damaged_file_fails_verification_and_nothing_is_dropped(
    engine, db, arch, archive_dir, damage
):
    make_months(db, OLD)
    audit_rows(db, OLD)
    old = next(
        p for p in archive_db.monthly_partitions(db) if p.name == partition("audit_log", OLD_MONTH)
    )
    cols = archive_db.columns(db, old.name)
    store = ArchiveStore(str(arch.archive_url))
    manifest = write_month(engine, store, old, cols, NOW)
    data = archive_dir / "audit_log" / f"{period_label(OLD_MONTH)}.parquet"
    if damage == "truncated":
        data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    else:  # a complete Parquet file of fewer rows than its manifest says
        rows = [r for batch in store.read(manifest) for r in batch]
        text = (archive_dir / "audit_log" / f"{period_label(OLD_MONTH)}.json").read_text()
        store.write(
            table=old.table,
            month=old.month,
            partition=old.name,
            columns=cols,
            batches=[rows[:1]],
            now=NOW,
            sql_digest=SqlDigest(rows=1),
        )
        (archive_dir / "audit_log" / f"{period_label(OLD_MONTH)}.json").write_text(text)

    report = archive_history(engine, arch, NOW)

    (outcome,) = [o for o in report.outcomes if o.table == "audit_log"]
    assert outcome.outcome == "failed"
    assert len(rows_of(db, old.name)) == 3
    assert not any(a.table == "audit_log" for a in archive_db.archived_months(db))


def test_a_file_url_works_like_a_directory(engine, db, arch, archive_dir):
    make_months(db, OLD)
    audit_rows(db, OLD)
    before = rows_of(db, partition("audit_log", OLD_MONTH))
    by_url = arch.model_copy(update={"archive_url": archive_dir.as_uri()})

    assert (
        outcomes(archive_history(engine, by_url, NOW))[("audit_log", period_label(OLD_MONTH))]
        == "archived"
    )
    (record,) = [a for a in archive_db.archived_months(db) if a.table == "audit_log"]
    assert record.url.startswith("file://")
    assert (archive_dir / "audit_log" / f"{period_label(OLD_MONTH)}.parquet").is_file()
    restore_month(engine, by_url, "audit_log", OLD_MONTH, NOW)
    assert rows_of(db, partition("audit_log", OLD_MONTH)) == before


def test_without_an_archive_url_old_months_stay_and_are_reported_waiting(engine, db, arch):
    make_months(db, OLD)
    audit_rows(db, OLD)
    report = archive_history(engine, arch.model_copy(update={"archive_url": None}), NOW)
    assert [(o.table, o.outcome, o.rows) for o in report.outcomes if o.table == "audit_log"] == [
        ("audit_log", "waiting", 0)
    ]
    assert exists(db, partition("audit_log", OLD_MONTH))


def test_the_listing_shows_archived_months_and_months_waiting(engine, db, arch):
    two_old = months_before(OLD, 1)
    make_months(db, OLD, two_old)
    audit_rows(db, OLD)
    audit_rows(db, two_old, n=2)
    archive_history(engine, arch, NOW)
    restore_month(engine, arch, "audit_log", OLD_MONTH, NOW)
    listing = archive_listing(engine, arch, NOW)
    assert {(a.table, a.month, a.rows, a.restored_at is None) for a in listing.archived} >= {
        ("audit_log", OLD_MONTH, 3, False),
        ("audit_log", month_start(two_old), 2, True),
    }
    assert [
        (w.table, w.month, w.outcome, w.rows) for w in listing.waiting if w.table == "audit_log"
    ] == [("audit_log", OLD_MONTH, "restored", 3)]


# --- the CLI -----------------------------------------------------------------------------------


@pytest.fixture
def cli(arch: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setenv("FAIRMETER_DATABASE_URL", arch.database_url)
    monkeypatch.setenv("FAIRMETER_ARCHIVE_URL", str(arch.archive_url))
    monkeypatch.setenv("FAIRMETER_EVENTS_RETENTION_MONTHS", "13")
    monkeypatch.setenv("FAIRMETER_HISTORY_RETENTION_MONTHS", "13")
    load_cli_settings.cache_clear()

    def invoke(*args: str) -> Any:
        return CliRunner().invoke(main, ["archive", *args])

    yield invoke
    load_cli_settings.cache_clear()


def test_the_cli_archives_lists_and_restores(db, cli):
    empty = cli("list")
    assert empty.output.splitlines()[:2] == [
        "archived: none",
        "past retention, in the database: none",
    ], empty.output
    make_months(db, OLD)
    audit_rows(db, OLD)
    period = period_label(OLD_MONTH)

    run = cli("run")
    assert run.exit_code == 0, run.output
    assert f"audit_log {period} archived, 3 row(s)" in run.output
    listed = cli("list")
    assert f"audit_log {period} 3 row(s) archived" in listed.output

    restored = cli("restore", period, "--table", "audit_log")
    assert restored.exit_code == 0, restored.output
    assert "3 row(s)" in restored.output
    assert len(rows_of(db, partition("audit_log", OLD_MONTH))) == 3


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["restore", "2025-13", "--table", "audit_log"], "not a month"),
        (["restore", "1999-01", "--table", "audit_log"], "not in the archive"),
    ],
)
def test_the_cli_refuses_a_bad_or_unarchived_period(cli, args, message):
    result = cli(*args)
    assert result.exit_code != 0
    assert message in result.output


def test_the_cli_refuses_a_month_already_present_and_a_missing_archive_url(db, cli, monkeypatch):
    make_months(db, OLD)
    audit_rows(db, OLD)
    assert cli("run").exit_code == 0
    period = period_label(OLD_MONTH)
    assert cli("restore", period, "--table", "audit_log").exit_code == 0

    again = cli("restore", period, "--table", "audit_log")
    assert again.exit_code != 0 and "already in the database" in again.output

    monkeypatch.delenv("FAIRMETER_ARCHIVE_URL")
    load_cli_settings.cache_clear()
    missing = cli("restore", period, "--table", "audit_log")
    assert missing.exit_code != 0 and "FAIRMETER_ARCHIVE_URL" in missing.output


def test_the_beat_asks_a_worker_to_archive_every_interval(settings):
    import reconciler.tasks  # noqa: F401  (registers the worker's tasks)
    from reconciler.celery_app import app as celery_app

    entry = celery_app.conf.beat_schedule["archive-history"]
    assert entry["task"] == "fairmeter.archive_history" in celery_app.tasks
    assert entry["schedule"] == settings.archive_interval_s == 86400


def test_the_archive_task_is_acknowledged_when_it_starts():
    """A month can take hours; RabbitMQ closes the channel of a delivery left unacknowledged
    past its consumer_timeout (30 minutes by default), so the archive may not ack late."""
    import reconciler.tasks  # noqa: F401  (registers the worker's tasks)
    from reconciler.celery_app import app as celery_app

    assert celery_app.conf.task_acks_late is True  # every other task
    assert celery_app.tasks["fairmeter.archive_history"].acks_late is False


def test_a_second_run_while_one_is_under_way_does_nothing(engine, db, arch):
    from metering.history.archive import ADVISORY_LOCK

    make_months(db, OLD)
    audit_rows(db, OLD)
    db.execute("SELECT pg_advisory_lock(%s)", (ADVISORY_LOCK,))  # the run under way
    try:
        report = archive_history(engine, arch, NOW)
    finally:
        db.execute("SELECT pg_advisory_unlock(%s)", (ADVISORY_LOCK,))
    assert report.busy and report.outcomes == []
    assert exists(db, partition("audit_log", OLD_MONTH))
    assert outcomes(archive_history(engine, arch, NOW))[("audit_log", period_label(OLD_MONTH))] == (
        "archived"
    )


def test_the_cli_without_an_archive_url_says_how_many_months_wait(db, cli, monkeypatch):
    make_months(db, OLD)
    audit_rows(db, OLD)
    monkeypatch.delenv("FAIRMETER_ARCHIVE_URL")
    load_cli_settings.cache_clear()
    result = cli("run")
    assert result.exit_code == 0
    assert f"audit_log {period_label(OLD_MONTH)} waiting" in result.output
    assert "month(s) past retention wait in the database" in result.output
    assert exists(db, partition("audit_log", OLD_MONTH))


# --- the application role, which owns nothing (docs/deploy/init-app-role.sql) ------------------


def test_the_app_role_verifies_but_only_the_owner_drops(engine, db, arch, app_role):  # noqa: F811
    make_months(db, OLD)
    audit_rows(db, OLD)
    _, app_url = app_role
    as_app = arch.model_copy(update={"database_url": app_url})
    app_engine = archive_engine(as_app)
    try:
        report = archive_history(app_engine, as_app, NOW)
    finally:
        app_engine.dispose()
    (outcome,) = [o for o in report.outcomes if o.table == "audit_log"]
    assert outcome.outcome == "failed" and "FAIRMETER_ARCHIVE_DATABASE_URL" in outcome.detail
    assert exists(db, partition("audit_log", OLD_MONTH))

    owner = as_app.model_copy(update={"archive_database_url": arch.database_url})
    owner_engine = archive_engine(owner)
    try:  # the file written as the app role is verified and the month dropped by the owner
        report = archive_history(owner_engine, owner, NOW)
        assert outcomes(report)[("audit_log", period_label(OLD_MONTH))] == "archived"
        # and the app role may bring it back: the partition function runs as its owner
        app_engine = archive_engine(as_app)
        restore_month(app_engine, as_app, "audit_log", OLD_MONTH, NOW)
        app_engine.dispose()
    finally:
        owner_engine.dispose()
    assert len(rows_of(db, partition("audit_log", OLD_MONTH))) == 3
