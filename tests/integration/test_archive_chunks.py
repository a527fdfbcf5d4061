"""A month written in chunks and compared under the lock by its SQL digest (issue #18,
metering/history/archive.py): each chunk in a transaction of its own, the file equal to the
partition row for row, a partition changed after its file was written caught under the lock,
and a manifest of format 1 still verified the old way. Real PostgreSQL, real files.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from metering.config import Settings
from metering.history import archive_db
from metering.history.archive import archive_history, restore_month, write_month
from metering.history.archive_files import DIGEST_KINDS, FORMAT_1, ArchiveStore, column_digest
from metering.history.archive_plan import Partition, period_label
from tests.integration import test_archive as base
from tests.integration.test_archive import (
    NOW,
    OLD,
    OLD_MONTH,
    exists,
    make_months,
    outcomes,
    partition,
    rows_of,
)

archive_dir = base.archive_dir
arch = base.arch
clean_history = base.clean_history

ROWS = 600  # some 10 heap pages of the audit log: 10 chunks of one page
# Every shape the audit log holds: NULL and empty texts, quotes, backslashes, non-ASCII,
# jsonb with nested NULLs, times to the microsecond.
_FILL = """
INSERT INTO audit_log (tenant_id, actor, actor_scope, action, target_type, target_id,
                       reason, before, after, created_at)
SELECT 'tenant-' || (g %% 3), 'key-' || g, 'support', 'credit', 'run', 'run-' || g,
       CASE g %% 4 WHEN 0 THEN NULL WHEN 1 THEN '' ELSE 'a ''' || g || ''' \\ é, "x"' END,
       CASE WHEN g %% 5 = 0 THEN NULL
            ELSE jsonb_build_object('n', g, 'list', jsonb_build_array(1, NULL, 'x', 1.50)) END,
       CASE WHEN g %% 2 = 0 THEN 'null'::jsonb ELSE NULL END,
       %(at)s::timestamptz + g * interval '1 minute 1 microsecond'
FROM generate_series(1, %(rows)s) AS g
"""


@pytest.fixture
def old_month(db: psycopg.Connection[Any]) -> Partition:
    make_months(db, OLD)
    at = OLD.replace(day=1, hour=0)
    db.execute(_FILL, {"at": at, "rows": ROWS})
    name = partition("audit_log", OLD_MONTH)
    return next(p for p in archive_db.monthly_partitions(db) if p.name == name)


def blocks_of(db: psycopg.Connection[Any], relation: str) -> int:
    return archive_db.heap_blocks(db, relation)


def test_a_month_of_many_chunks_is_archived_and_restored_row_for_row(engine, db, arch, old_month):
    before = rows_of(db, old_month.name)
    assert blocks_of(db, old_month.name) >= 5  # so one page a chunk makes several chunks

    report = archive_history(engine, arch, NOW, chunk_blocks=1)

    assert outcomes(report)[("audit_log", period_label(OLD_MONTH))] == "archived"
    assert not exists(db, old_month.name)
    restore_month(engine, arch, "audit_log", OLD_MONTH, NOW)
    assert rows_of(db, old_month.name) == before  # every column of every row, as it was


@pytest.fixture
def chunk_transactions(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[datetime, int]]]:
    """The transaction (its start time, and the backend) each chunk of a write was read in."""
    seen: list[tuple[datetime, int]] = []
    stream_rows = archive_db.stream_rows

    def recording(conn: psycopg.Connection[Any], *args: Any, **kwargs: Any) -> Any:
        row = conn.execute("SELECT transaction_timestamp(), pg_backend_pid()").fetchone()
        assert row is not None
        seen.append((row[0], row[1]))
        return stream_rows(conn, *args, **kwargs)

    monkeypatch.setattr(archive_db, "stream_rows", recording)
    yield seen


def test_each_chunk_is_read_in_a_transaction_of_its_own(
    engine, db, arch, old_month, chunk_transactions
):
    store = ArchiveStore(str(arch.archive_url))
    cols = archive_db.columns(db, old_month.name)
    pages = blocks_of(db, old_month.name)

    manifest = write_month(engine, store, old_month, cols, NOW, chunk_blocks=2)

    assert manifest.rows == ROWS
    assert len(chunk_transactions) == (pages + 1) // 2 >= 3
    started = [at for at, _ in chunk_transactions]
    assert len(set(started)) == len(started)  # no transaction lasted over two chunks
    assert started == sorted(started)


def change(db: psycopg.Connection[Any], relation: str, how: str) -> None:
    """Change a row of an archived month behind the archive's back (the append-only
    trigger is for the application; a replica-role session, like a restore by hand, skips
    it)."""
    target = sql.Identifier(relation)
    with db.transaction():
        db.execute("SET LOCAL session_replication_role = replica")
        if how == "inserted":
            base.audit_rows(db, OLD, n=1)
        elif how == "deleted":
            db.execute(
                sql.SQL("DELETE FROM {} WHERE id = (SELECT min(id) FROM {})").format(target, target)
            )
        else:  # a value changed, the count the same
            db.execute(
                sql.SQL(
                    "UPDATE {} SET reason = 'changed' WHERE id = (SELECT max(id) FROM {})"
                ).format(target, target)
            )


@pytest.mark.parametrize("how", ["inserted", "deleted", "updated"])
def test_a_partition_changed_after_its_file_was_written_is_caught_under_the_lock(
    engine, db, arch, old_month, how
):
    store = ArchiveStore(str(arch.archive_url))
    write_month(engine, store, old_month, archive_db.columns(db, old_month.name), NOW, 2)
    change(db, old_month.name, how)
    after = rows_of(db, old_month.name)

    report = archive_history(engine, arch, NOW, chunk_blocks=2)

    (outcome,) = [o for o in report.outcomes if o.table == "audit_log"]
    assert outcome.outcome == "failed" and "nothing is dropped" in outcome.detail
    assert rows_of(db, old_month.name) == after
    assert not any(a.table == "audit_log" for a in archive_db.archived_months(db))


def as_format_1(store: ArchiveStore, manifest_path: Path, old_month: Partition) -> None:
    """Rewrite a month's manifest as the archive wrote it before format 2: the Parquet file
    is the same, the digest is over the rows as Python values, and there is no SQL digest."""
    manifest = store.manifest(old_month.table, old_month.month)
    assert manifest is not None
    python_digest = column_digest(manifest.columns)
    for rows in store.read(manifest):
        python_digest.add(rows)
    data = json.loads(manifest_path.read_text())
    del data["sql_digest"], data["sql_digest_kind"]
    data.update(format=FORMAT_1, digest=python_digest.hex, digest_kind=DIGEST_KINDS[FORMAT_1])
    manifest_path.write_text(json.dumps(data))


@pytest.mark.parametrize("changed", [False, True])
def test_a_format_1_manifest_is_still_verified_row_by_row(
    engine, db, arch, archive_dir, old_month, changed
):
    store = ArchiveStore(str(arch.archive_url))
    write_month(engine, store, old_month, archive_db.columns(db, old_month.name), NOW)
    manifest_path = archive_dir / "audit_log" / f"{period_label(OLD_MONTH)}.json"
    as_format_1(store, manifest_path, old_month)
    if changed:
        change(db, old_month.name, "updated")
    before = rows_of(db, old_month.name)

    report = archive_history(engine, arch, NOW)

    (outcome,) = [o for o in report.outcomes if o.table == "audit_log"]
    if changed:
        assert outcome.outcome == "failed" and exists(db, old_month.name)
        return
    assert outcome.outcome == "archived" and not exists(db, old_month.name)
    assert json.loads(manifest_path.read_text())["format"] == FORMAT_1  # not written again
    restore_month(engine, arch, "audit_log", OLD_MONTH, NOW)
    assert rows_of(db, old_month.name) == before


def test_a_month_archived_now_has_a_format_2_manifest_with_its_sql_digest(
    engine, db, arch: Settings, archive_dir, old_month
):
    archive_history(engine, arch, NOW)
    data = json.loads((archive_dir / "audit_log" / f"{period_label(OLD_MONTH)}.json").read_text())
    assert data["format"] == "fairmeter-archive/2"
    assert data["rows"] == ROWS and len(data["sql_digest"]) == 32


def test_the_compare_under_the_lock_is_one_read_committed_statement_per_chunk(
    engine, db, arch, old_month, monkeypatch
):
    """In READ COMMITTED each statement takes its own snapshot and drops it when done, so a
    compare of many statements holds back VACUUM's horizon only one chunk at a time."""
    store = ArchiveStore(str(arch.archive_url))
    write_month(engine, store, old_month, archive_db.columns(db, old_month.name), NOW, 2)
    isolation: list[str] = []
    sql_digest = archive_db.sql_digest

    def recording(conn: psycopg.Connection[Any], *args: Any) -> Any:
        row = conn.execute("SELECT current_setting('transaction_isolation')").fetchone()
        assert row is not None
        isolation.append(row[0])
        return sql_digest(conn, *args)

    monkeypatch.setattr(archive_db, "sql_digest", recording)
    report = archive_history(engine, arch, NOW, chunk_blocks=2)

    assert outcomes(report)[("audit_log", period_label(OLD_MONTH))] == "archived"
    assert len(isolation) >= 3  # a statement for each chunk of two pages
    assert set(isolation) == {"read committed"}
