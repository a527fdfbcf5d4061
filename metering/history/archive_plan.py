"""What the archive decides, without a database or a file: months, retention, digests.

A monthly partition covers ``[first, next first)`` in UTC (``partitions.py``). It leaves the
database once its whole month ended more than its table's retention ago: raw events after
``events_retention_months`` (13), every other monthly table (ledger, decisions, usage lines,
Stripe deliveries, audit log) after ``history_retention_months`` (84, seven years). A table
the settings do not name keeps the longer one.

The digest proves a file holds exactly the rows of a partition: every column of every row
is written out with its type (``repr``: a NULL, ``''`` and ``'null'`` differ; an array keeps
its order and its NULL elements; a time is its UTC instant), hashed, and the row hashes are
added modulo 2**256, so the digest does not depend on the order rows are read in, and equal
rows counted twice still count.

A second digest, the SQL digest (``SqlDigest``), is computed by PostgreSQL itself over the
same rows: the text of each row (``row::text``, times in UTC) hashed with SHA-256 and summed,
all in C. It is what lets the partition be compared under its lock in one statement, without
sending a row to Python: the file's digest proves the file holds the rows written, the SQL
digest proves the partition still holds those rows (``archive.py``).
"""

from __future__ import annotations

import calendar
import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any, Final

from metering.config import Settings
from metering.history.partitions import month_start, months_after

EVENT_TABLES: Final = frozenset({"events"})
PERIOD = re.compile(r"(\d{4})-(\d{2})")
_BOUND = re.compile(r"FOR VALUES FROM \('([^']+)'\) TO \('([^']+)'\)")
_DIGEST_MODULUS: Final = 2**256
_SQL_DIGEST_MODULUS: Final = 2**128
SQL_DIGEST_KIND: Final = (
    "sum of sha256(row::text in UTC): bytes 1-8 and 9-16 as signed int64 hi, lo; "
    "hi*2^64 + lo summed mod 2^128"
)


class PeriodError(ValueError):
    """A period that is not ``YYYY-MM``."""


def parse_period(text: str) -> date:
    """``YYYY-MM`` → the first day of that month."""
    match = PERIOD.fullmatch(text.strip())
    if not match or not 1 <= int(match.group(2)) <= 12:
        raise PeriodError(f"{text!r} is not a month: write it YYYY-MM, e.g. 2025-03")
    return date(int(match.group(1)), int(match.group(2)), 1)


def period_label(month: date) -> str:
    return f"{month:%Y-%m}"


def months_before(moment: datetime, months: int) -> datetime:
    """``moment`` ``months`` calendar months earlier, the day clamped to the shorter month
    (31 March − 1 month = 28 or 29 February)."""
    index = moment.year * 12 + moment.month - 1 - months
    year, month = divmod(index, 12)
    day = min(moment.day, calendar.monthrange(year, month + 1)[1])
    return moment.replace(year=year, month=month + 1, day=day)


def retention_months(table: str, settings: Settings) -> int:
    if table in EVENT_TABLES:
        return settings.events_retention_months
    return settings.history_retention_months


def past_retention(month: date, now: datetime, retention: int) -> bool:
    """Whether the whole of ``month`` ended at or before ``now`` − ``retention`` months."""
    month_end = datetime.combine(months_after(month, 1), datetime.min.time(), UTC)
    return month_end <= months_before(now.astimezone(UTC), retention)


@dataclass(frozen=True, slots=True)
class Partition:
    """One monthly partition of a partitioned table, read from the catalog."""

    table: str
    name: str
    month: date


def month_of_bound(bound: str) -> date | None:
    """The month a partition bound (``pg_get_expr(relpartbound)``) covers, or ``None`` when
    it is not exactly one calendar month in UTC (the default partition, a hand-made range):
    such a partition is never archived."""
    match = _BOUND.fullmatch(bound.strip())
    if not match:
        return None
    try:
        lower, upper = (datetime.fromisoformat(part) for part in match.groups())
    except ValueError:
        return None
    if lower.tzinfo is None or lower.utcoffset() != timedelta(0):
        return None
    first = month_start(lower)
    exact = datetime.combine(first, datetime.min.time(), UTC)
    following = datetime.combine(months_after(first, 1), datetime.min.time(), UTC)
    return first if lower == exact and upper == following else None


def due_partitions(
    partitions: Iterable[Partition], now: datetime, settings: Settings
) -> list[Partition]:
    """The partitions whose month is past their table's retention, oldest first."""
    due = [
        p for p in partitions if past_retention(p.month, now, retention_months(p.table, settings))
    ]
    return sorted(due, key=lambda p: (p.month, p.table))


def kept_for_audit(restored_at: datetime | None, now: datetime, keep: timedelta) -> datetime | None:
    """Until when a month restored at ``restored_at`` stays in the database for its audit;
    ``None`` when it is not restored, or its time is up (it may leave again)."""
    if restored_at is None or now >= restored_at + keep:
        return None
    return restored_at + keep


# --- the digest -------------------------------------------------------------------------------


def _canonical(value: Any) -> Any:
    """A time as naive UTC (the same instant reads back with another tzinfo object)."""
    if type(value) is datetime and value.tzinfo is not None:
        return value.astimezone(UTC).replace(tzinfo=None)
    if type(value) is list:
        return [_canonical(item) for item in value]
    return value


def row_hash(row: Sequence[Any], recast: Sequence[int] | None = None) -> int:
    """SHA-256 of the row's ``repr``: unambiguous for the values a row holds (None, bool,
    int, str, bytes, Decimal, date, times, lists), each with its type (NULL, ``''`` and
    ``'null'`` differ, as do ``true`` and ``1``, ``1.5`` and ``1.50``). ``recast``: the
    positions that may hold times (all, when not given); the rest is hashed as it is."""
    values = list(row)
    for index in range(len(values)) if recast is None else recast:
        values[index] = _canonical(values[index])
    return int.from_bytes(hashlib.sha256(repr(values).encode()).digest(), "big")


@dataclass(slots=True)
class Digest:
    """Rows seen and their order-independent digest, fed batch by batch. ``recast``: the
    positions of columns that may hold times (timestamps, arrays), to spare the others."""

    recast: Sequence[int] | None = None
    rows: int = 0
    total: int = 0

    def add(self, rows: Iterable[Sequence[Any]]) -> None:
        total, recast = self.total, self.recast
        for row in rows:
            self.rows += 1
            total += row_hash(row, recast)
        self.total = total % _DIGEST_MODULUS

    @property
    def hex(self) -> str:
        return f"{self.total:064x}"


@dataclass(slots=True)
class SqlDigest:
    """Rows and the SQL digest of a relation, or of chunks of it added up: the sums are
    additive, so the hashes of the rows written, chunk by chunk, add up to the digest of the
    whole partition summed by PostgreSQL under its lock."""

    rows: int = 0
    total: int = 0

    def add(self, rows: int, high_sum: int, low_sum: int) -> None:
        """Add what PostgreSQL summed over some rows (``archive_db.sql_digest``)."""
        self.rows += rows
        self.total = (self.total + high_sum * 2**64 + low_sum) % _SQL_DIGEST_MODULUS

    def merge(self, other: SqlDigest) -> None:
        """Add the digest of other rows (another range of the same relation)."""
        self.rows += other.rows
        self.total = (self.total + other.total) % _SQL_DIGEST_MODULUS

    def add_row_hashes(self, hashes: Iterable[bytes]) -> None:
        """Add rows by their SHA-256 as PostgreSQL gave it: the same sums, taken in Python."""
        total, rows, from_bytes = self.total, self.rows, int.from_bytes
        for row_hash in hashes:
            rows += 1
            high = from_bytes(row_hash[:8], "big", signed=True)
            total += high * 2**64 + from_bytes(row_hash[8:16], "big", signed=True)
        self.rows, self.total = rows, total % _SQL_DIGEST_MODULUS

    @property
    def hex(self) -> str:
        return f"{self.total:032x}"
