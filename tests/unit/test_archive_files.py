"""Parquet files of the archive (metering/history/archive_files.py): every type the monthly
tables use comes back as the same value, a damaged file is an error, and a month is in the
archive only once its manifest is. Real files in a temporary directory."""

from __future__ import annotations

from datetime import UTC, date, datetime
from pathlib import Path

import pytest

from metering.history.archive_files import ArchiveFileError, ArchiveStore, Column
from metering.history.archive_plan import SqlDigest

MONTH = date(2025, 9, 1)
NOW = datetime(2026, 12, 2, tzinfo=UTC)
COLUMNS = [
    Column("id", "bigint"),
    Column("version", "integer"),
    Column("tenant_id", "character varying(64)"),
    Column("note", "text"),
    Column("data", "jsonb"),
    Column("body_hash", "bytea"),
    Column("rule_ids", "text[]"),
    Column("line_ids", "bigint[]"),
    Column("received_at", "timestamp with time zone"),
    Column("flag", "boolean"),
]
ROWS = [
    (
        1,
        7,
        "acme",
        "é \\ ' \"\n\t",
        '{"a": [1, null, "x"], "b": {"c": 1.5}}',
        b"\x00\xff\x10",
        ["R1", None, ""],
        [1, None, 9_223_372_036_854_775_807],
        datetime(2025, 9, 30, 23, 59, 59, 999_999, tzinfo=UTC),
        True,
    ),
    (2, None, "other", None, None, None, None, [], datetime(2025, 9, 1, tzinfo=UTC), None),
    (3, 0, "", "", "{}", b"", [], None, datetime(2025, 9, 15, 12, 0, 0, 1, tzinfo=UTC), False),
]


def counted(rows: int) -> SqlDigest:
    """A SQL digest as the database would have counted ``rows`` rows (no database here)."""
    return SqlDigest(rows=rows, total=rows)


def write(store: ArchiveStore, rows=ROWS, columns=COLUMNS):
    return store.write(
        table="events",
        month=MONTH,
        partition="events_y2025m09",
        columns=columns,
        batches=[rows[:2], rows[2:]],
        now=NOW,
        sql_digest=counted(len(rows)),
    )


def test_every_type_reads_back_as_the_same_value(tmp_path: Path):
    store = ArchiveStore(str(tmp_path))
    manifest = write(store)
    read = [row for batch in store.read(manifest) for row in batch]
    assert read == ROWS
    assert (manifest.rows, manifest.sql_digest) == (3, counted(3).hex)
    read_back = store.digest(manifest)
    assert (read_back.rows, read_back.hex) == (3, manifest.digest)
    assert store.manifest("events", MONTH) == manifest
    assert sorted(p.name for p in (tmp_path / "events").iterdir()) == [
        "2025-09.json",
        "2025-09.parquet",
    ]


def test_a_file_url_and_a_directory_are_the_same_archive(tmp_path: Path):
    write(ArchiveStore(tmp_path.as_uri()))
    manifest = ArchiveStore(str(tmp_path)).manifest("events", MONTH)
    assert manifest is not None and manifest.rows == 3
    assert ArchiveStore(tmp_path.as_uri()).data_url("events", MONTH).startswith("file://")


def test_a_month_without_manifest_is_not_in_the_archive(tmp_path: Path):
    store = ArchiveStore(str(tmp_path))
    write(store)
    (tmp_path / "events" / "2025-09.json").unlink()
    assert store.manifest("events", MONTH) is None


def test_a_truncated_file_cannot_be_read(tmp_path: Path):
    store = ArchiveStore(str(tmp_path))
    manifest = write(store)
    data = tmp_path / "events" / "2025-09.parquet"
    data.write_bytes(data.read_bytes()[:-100])
    with pytest.raises(ArchiveFileError, match="cannot be read"):
        store.digest(manifest)


def test_a_type_without_an_exact_parquet_twin_is_refused(tmp_path: Path):
    with pytest.raises(ArchiveFileError, match="no exact Parquet type"):
        write(ArchiveStore(str(tmp_path)), rows=[(1,)], columns=[Column("p", "point")])
    assert not list(tmp_path.rglob("*.partial-*"))
    assert ArchiveStore(str(tmp_path)).manifest("events", MONTH) is None
