"""What the archive decides, without a database or a file: months, retention, digests.

A monthly partition covers ``[first, next first)`` in UTC (``partitions.py``). It leaves the
database once its whole month ended more than its table's retention ago: raw events after
``events_retention_months`` (13), every other monthly table (ledger, decisions, usage lines,
Stripe deliveries, audit log) after ``history_retention_months`` (84, seven years). A table
the settings do not name keeps the longer one.

The digest proves a file holds exactly the rows of a partition: every column of every row
is encoded with its type (a NULL, ``''`` and ``'null'`` differ; an array keeps its order
and its NULL elements), hashed, and the row hashes are added modulo 2**256, so the digest
does not depend on the order rows are read in, and equal rows counted twice still count.
"""

from __future__ import annotations

import calendar
import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any, Final

from metering.config import Settings
from metering.history.partitions import month_start, months_after

EVENT_TABLES: Final = frozenset({"events"})
PERIOD = re.compile(r"(\d{4})-(\d{2})")
_BOUND = re.compile(r"FOR VALUES FROM \('([^']+)'\) TO \('([^']+)'\)")
_DIGEST_MODULUS: Final = 2**256


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


# --- the digest -------------------------------------------------------------------------------


def _encode(value: Any) -> bytes:
    """One value, tagged with its kind and length-prefixed, so no two values collide."""
    if value is None:
        return b"N"
    if isinstance(value, bool):
        return b"T" if value else b"F"
    if isinstance(value, int):
        return _tagged(b"i", str(value).encode())
    if isinstance(value, str):
        return _tagged(b"s", value.encode())
    if isinstance(value, bytes | bytearray | memoryview):
        return _tagged(b"b", bytes(value))
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise TypeError("a naive timestamp cannot be digested: times are UTC")
        return _tagged(b"t", value.astimezone(UTC).isoformat(timespec="microseconds").encode())
    if isinstance(value, date):
        return _tagged(b"d", value.isoformat().encode())
    if isinstance(value, float):
        return _tagged(b"f", value.hex().encode())
    if isinstance(value, Decimal):
        return _tagged(b"n", str(value).encode())
    if isinstance(value, list | tuple):
        return _tagged(b"l", b"".join(_encode(item) for item in value))
    raise TypeError(f"cannot digest a {type(value).__name__}")


def _tagged(tag: bytes, payload: bytes) -> bytes:
    return tag + str(len(payload)).encode() + b":" + payload


def row_hash(row: Sequence[Any]) -> int:
    return int.from_bytes(hashlib.sha256(_encode(list(row))).digest(), "big")


@dataclass(slots=True)
class Digest:
    """Rows seen and their order-independent digest, fed batch by batch."""

    rows: int = 0
    total: int = 0

    def add(self, rows: Iterable[Sequence[Any]]) -> None:
        for row in rows:
            self.rows += 1
            self.total = (self.total + row_hash(row)) % _DIGEST_MODULUS

    @property
    def hex(self) -> str:
        return f"{self.total:064x}"
