"""Archived months as Parquet files, through fsspec (a directory, ``file://``, ``s3://``…).

Layout under the archive URL: ``<table>/<YYYY-MM>.parquet`` holds the month's rows, and
``<table>/<YYYY-MM>.json`` its manifest (rows, digest, columns and their types, when it was
written). Each is written under a temporary name and moved into place, the manifest last:
a month is in the archive when its manifest is, so a run killed half-way leaves at most a
stray temporary file or a Parquet file without manifest, which the next run writes again.

Every PostgreSQL type the monthly tables use maps to one Arrow type that gives the same
Python value back: ``jsonb`` (and ``numeric``, ``uuid``) as their PostgreSQL text, which
PostgreSQL parses back to the same value; ``timestamptz`` as microseconds in UTC; arrays as
lists, NULL elements kept. A type not listed is refused rather than stored approximately.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any, Final

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from metering.history.archive_plan import SQL_DIGEST_KIND, Digest, SqlDigest, period_label
from metering.history.arrow_digest import ArrowDigest

# Format 1: the digest over Python's repr of each row (archive_plan.row_hash), no SQL digest.
# Format 2: the digest over Arrow's encoding of each row (arrow_digest.py) and the SQL
# digest of the rows written. A manifest of either is read and verified by its own digest.
FORMAT_1: Final = "fairmeter-archive/1"
FORMAT: Final = "fairmeter-archive/2"
DIGEST_KINDS: Final = {
    FORMAT_1: "sum of sha256(repr(row), times as naive UTC) mod 2^256",
    FORMAT: "sum of sha256(row as N or <length>:<bytes> fields joined by |, by Arrow) mod 2^256",
}

_SCALARS: Final[dict[str, pa.DataType]] = {
    "bigint": pa.int64(),
    "integer": pa.int32(),
    "smallint": pa.int16(),
    "boolean": pa.bool_(),
    "text": pa.string(),
    "jsonb": pa.string(),
    "json": pa.string(),
    "numeric": pa.string(),
    "uuid": pa.string(),
    "bytea": pa.binary(),
    "timestamp with time zone": pa.timestamp("us", tz="UTC"),
    "date": pa.date32(),
    "double precision": pa.float64(),
    "real": pa.float32(),
}


class ArchiveFileError(Exception):
    """A file that is missing, unreadable, or not what its manifest says."""


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    pg_type: str  # format_type(): ``character varying(64)``, ``text[]``…


def arrow_type(pg_type: str) -> pa.DataType:
    base = pg_type.split("(")[0].strip() if not pg_type.endswith("[]") else pg_type[:-2]
    if base.startswith("character varying") or base.startswith("character"):
        base = "text"
    if pg_type.endswith("[]"):
        return pa.list_(arrow_type(base))
    if base.startswith("numeric"):
        base = "numeric"
    try:
        return _SCALARS[base]
    except KeyError:
        raise ArchiveFileError(f"no exact Parquet type for PostgreSQL {pg_type}") from None


def column_digest(columns: Sequence[Column]) -> Digest:
    """An empty digest that knows which columns may hold times (timestamps, arrays)."""
    recast = [i for i, c in enumerate(columns) if "time" in c.pg_type or c.pg_type.endswith("[]")]
    return Digest(recast=recast)


def arrow_schema(columns: Sequence[Column]) -> pa.Schema:
    return pa.schema([pa.field(c.name, arrow_type(c.pg_type)) for c in columns])


@dataclass(frozen=True, slots=True)
class Manifest:
    table: str
    month: date
    partition: str
    rows: int
    digest: str
    columns: tuple[Column, ...]
    written_at: datetime
    # The SQL digest of the rows written (archive_plan.SqlDigest), each row's hash taken by
    # the statement that read the row. None in format 1, which had none: such a month is
    # compared with the partition row by row in Python, as it was written.
    sql_digest: str | None = None
    format: str = FORMAT

    def as_json(self) -> str:
        extra = (
            {"sql_digest": self.sql_digest, "sql_digest_kind": SQL_DIGEST_KIND}
            if self.sql_digest is not None
            else {}
        )
        return json.dumps(
            {
                "format": self.format,
                "table": self.table,
                "month": period_label(self.month),
                "partition": self.partition,
                "rows": self.rows,
                "digest": self.digest,
                "digest_kind": DIGEST_KINDS[self.format],
                "columns": [
                    {"name": c.name, "pg_type": c.pg_type, "arrow_type": str(arrow_type(c.pg_type))}
                    for c in self.columns
                ],
                "written_at": self.written_at.isoformat(),
                **extra,
            },
            indent=2,
        )

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        data = json.loads(text)
        if data.get("format") not in DIGEST_KINDS:
            raise ArchiveFileError(f"manifest format {data.get('format')!r} is not known")
        if data["format"] == FORMAT and data.get("sql_digest_kind") != SQL_DIGEST_KIND:
            raise ArchiveFileError(f"SQL digest {data.get('sql_digest_kind')!r} is not known")
        return cls(
            table=data["table"],
            month=date.fromisoformat(data["month"] + "-01"),
            partition=data["partition"],
            rows=int(data["rows"]),
            digest=data["digest"],
            columns=tuple(Column(c["name"], c["pg_type"]) for c in data["columns"]),
            written_at=datetime.fromisoformat(data["written_at"]),
            sql_digest=data.get("sql_digest") if data["format"] == FORMAT else None,
            format=data["format"],
        )


class ArchiveStore:
    """The archive at one fsspec URL."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.fs, self.root = fsspec.core.url_to_fs(self.url)

    def data_url(self, table: str, month: date) -> str:
        return f"{self.url}/{table}/{period_label(month)}.parquet"

    def _path(self, table: str, month: date, suffix: str) -> str:
        return f"{self.root}/{table}/{period_label(month)}.{suffix}"

    def manifest(self, table: str, month: date) -> Manifest | None:
        """The month's manifest; ``None`` while the month is not (completely) archived."""
        path = self._path(table, month, "json")
        if not self.fs.exists(path):
            return None
        with self.fs.open(path, "rb") as handle:
            manifest = Manifest.from_json(handle.read().decode())
        if (manifest.table, manifest.month) != (table, month):
            raise ArchiveFileError(f"{path} describes {manifest.table} {manifest.month}")
        return manifest

    def write(
        self,
        *,
        table: str,
        month: date,
        partition: str,
        columns: Sequence[Column],
        batches: Iterable[Sequence[tuple[Any, ...]]],
        now: datetime,
        sql_digest: SqlDigest,
    ) -> Manifest:
        """Write the rows, then the manifest, each under a temporary name moved into place.
        ``sql_digest`` is filled as the batches are read (by whoever yields them) and must
        count the rows written: it goes into the manifest."""
        schema = arrow_schema(columns)
        digest = ArrowDigest()
        self.fs.makedirs(f"{self.root}/{table}", exist_ok=True)
        final = self._path(table, month, "parquet")
        partial = f"{final}.partial-{uuid.uuid4().hex}"
        try:
            with self.fs.open(partial, "wb") as handle, pq.ParquetWriter(handle, schema) as out:
                for rows in batches:
                    batch = _to_batch(schema, rows)
                    digest.add(batch)
                    out.write_batch(batch)
            if sql_digest.rows != digest.rows:
                raise ArchiveFileError(
                    f"{digest.rows} row(s) written, but the database counted {sql_digest.rows}"
                )
            self.fs.mv(partial, final)
        finally:
            if self.fs.exists(partial):
                self.fs.rm(partial)
        manifest = Manifest(
            table,
            month,
            partition,
            digest.rows,
            digest.hex,
            tuple(columns),
            now,
            sql_digest.hex,
        )
        self._put_text(self._path(table, month, "json"), manifest.as_json())
        return manifest

    def _put_text(self, path: str, text: str) -> None:
        partial = f"{path}.partial-{uuid.uuid4().hex}"
        with self.fs.open(partial, "wb") as handle:
            handle.write(text.encode())
        self.fs.mv(partial, path)

    def batches(self, manifest: Manifest, batch_rows: int = 50_000) -> Iterator[pa.RecordBatch]:
        """The month's rows as written, Arrow batch by batch (checked against the manifest's
        columns and types, not its digest: see :meth:`digest`)."""
        path = self._path(manifest.table, manifest.month, "parquet")
        expected = arrow_schema(manifest.columns)
        try:
            with self.fs.open(path, "rb") as handle:
                parquet = pq.ParquetFile(handle)
                if not parquet.schema_arrow.equals(expected):
                    raise ArchiveFileError(f"{path}: columns differ from its manifest")
                yield from parquet.iter_batches(batch_size=batch_rows)
        except (OSError, pa.ArrowException) as exc:  # missing, truncated, not Parquet
            raise ArchiveFileError(f"{path} cannot be read: {exc}") from exc

    def read(self, manifest: Manifest, batch_rows: int = 50_000) -> Iterator[list[tuple[Any, ...]]]:
        """The month's rows as written, as Python values, batch by batch."""
        for batch in self.batches(manifest, batch_rows):
            yield list(zip(*(column.to_pylist() for column in batch.columns), strict=True))

    def digest(self, manifest: Manifest) -> Digest | ArrowDigest:
        """Read the whole file back and digest it as its manifest's format says: format 2 on
        the Arrow batches as they come, format 1 on the rows as Python values."""
        if manifest.format == FORMAT_1:
            python_digest = column_digest(manifest.columns)
            for rows in self.read(manifest):
                python_digest.add(rows)
            return python_digest
        arrow_digest = ArrowDigest()
        for batch in self.batches(manifest):
            arrow_digest.add(batch)
        return arrow_digest


def _to_batch(schema: pa.Schema, rows: Sequence[tuple[Any, ...]]) -> pa.RecordBatch:
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in schema]
    arrays = [
        pa.array(list(values), type=field.type)
        for values, field in zip(columns, schema, strict=True)
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
