"""Parquet files of the archive (metering/history/archive_files.py): every type the monthly
tables use comes back as the same value, a damaged file is an error, and a month is in the
archive only once its manifest is. Real files in a temporary directory."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pytest

from metering.history.archive_files import (
    FORMAT_1,
    ArchiveFileError,
    ArchiveStore,
    Column,
    arrow_schema,
    arrow_type,
)
from metering.history.archive_plan import SqlDigest
from metering.history.arrow_digest import ArrowDigest

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


# --- the file digest of format 2 (metering/history/arrow_digest.py) ---------------------------

TEXTS = [Column("a", "text"), Column("b", "text")]
LISTS = [Column("l", "text[]")]


def arrow_digest(columns: list[Column], *batches: list[tuple]) -> str:
    digest = ArrowDigest()
    for rows in batches:
        values = list(zip(*rows, strict=True))
        typed = zip(values, columns, strict=True)
        arrays = [pa.array(list(v), arrow_type(c.pg_type)) for v, c in typed]
        digest.add(pa.RecordBatch.from_arrays(arrays, schema=arrow_schema(columns)))
    return digest.hex


@pytest.mark.parametrize(
    ("columns", "one", "other"),
    [
        (TEXTS, ("", None), (None, "")),  # NULL is not the empty text
        (TEXTS, ("null", None), (None, None)),
        (TEXTS, ("a|1:b", None), ("a", "b")),  # a separator inside a value stays a value
        (TEXTS, ("ab", ""), ("a", "b")),
        (LISTS, ([],), (None,)),  # an empty list is not a NULL list
        (LISTS, ([None],), ([],)),
        (LISTS, ([""],), ([],)),
        (LISTS, (["a,b"],), (["a", "b"],)),
        (LISTS, (["a", None],), ([None, "a"],)),  # a list keeps its order
        ([Column("n", "bigint")], (1,), (-1,)),
        ([Column("f", "boolean")], (True,), (None,)),
        ([Column("x", "bytea")], (b"\x00",), (b"",)),
        ([Column("i", "bigint[]")], ([1, None],), ([1],)),
    ],
)
def test_the_format_2_digest_tells_apart_rows_that_differ_only_subtly(columns, one, other):
    assert arrow_digest(columns, [one]) != arrow_digest(columns, [other])


def test_the_format_2_digest_ignores_row_order_and_batches_but_counts_repeats():
    rows = [(str(i), None if i % 2 else "x") for i in range(7)]
    whole = arrow_digest(TEXTS, rows)
    assert arrow_digest(TEXTS, rows[4:], rows[:4]) == whole
    assert arrow_digest(TEXTS, list(reversed(rows))) == whole
    assert arrow_digest(TEXTS, rows + rows[:1]) != whole


def test_the_format_2_digest_takes_a_time_as_its_instant():
    columns = [Column("t", "timestamp with time zone")]
    utc = datetime(2025, 9, 1, 12, 0, 0, 1, tzinfo=UTC)
    paris = utc.astimezone(timezone(timedelta(hours=2)))
    assert arrow_digest(columns, [(utc,)]) == arrow_digest(columns, [(paris,)])
    assert arrow_digest(columns, [(utc,)]) != arrow_digest(
        columns, [(utc + timedelta(microseconds=1),)]
    )


def test_a_manifest_of_format_1_is_read_and_an_unknown_format_refused(tmp_path: Path):
    store = ArchiveStore(str(tmp_path))
    manifest = write(store)
    path = tmp_path / "events" / "2025-09.json"
    data = json.loads(path.read_text())
    del data["sql_digest"], data["sql_digest_kind"]
    path.write_text(json.dumps({**data, "format": FORMAT_1}))
    old = store.manifest("events", MONTH)
    assert old is not None and (old.format, old.sql_digest, old.digest) == (
        FORMAT_1,
        None,
        manifest.digest,
    )
    path.write_text(json.dumps({**data, "format": "fairmeter-archive/9"}))
    with pytest.raises(ArchiveFileError, match="not known"):
        store.manifest("events", MONTH)
