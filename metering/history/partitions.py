"""Monthly partitions made ahead of the rows that need them.

A partitioned table (``docs/scaling.md``, "Monthly partitions") stores each month's rows in
its own partition, ``<table>_yYYYYmMM``. A row whose month has no partition goes to the
table's DEFAULT partition: stored, never refused, but that partition then holds rows of a
month, and PostgreSQL refuses to create that month's partition until an operator moves them
(the month is reported ``blocked``, and the error is logged each hour until it is fixed). So
the beat task ``fairmeter.ensure_partitions`` makes this month's partition and the next
``ahead`` months' every hour, long before a row needs them; each call creates only what is
missing. Which partitions a table has for a month is decided in one place, the SQL function
``fairmeter_ensure_month_partitions`` (migration 0023), which the migration that
partitions a table calls too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any, Final

import psycopg

# The tables kept as monthly partitions, and the column that picks a row's month (a
# server-set time, so a producer's clock cannot send a row to a month long gone or far off).
# audit_log since migration 0023, the others since 0024.
MONTHLY_TABLES: Final[dict[str, str]] = {
    "events": "received_at",
    "usage_lines": "received_at",
    "ledger_entries": "created_at",
    "decisions": "decided_at",
    "stripe_deliveries": "stripe_received_at",
    "audit_log": "created_at",
}


@dataclass(frozen=True, slots=True)
class MonthPartition:
    table: str
    partition: str
    outcome: str  # created, exists, or blocked (the default partition holds its rows)


def month_start(moment: datetime) -> date:
    return moment.astimezone(UTC).date().replace(day=1)


def months_after(first: date, months: int) -> date:
    index = first.year * 12 + first.month - 1 + months
    return date(index // 12, index % 12 + 1, 1)


def ensure_month_partitions(
    conn: psycopg.Connection[Any], now: datetime, ahead: int
) -> list[MonthPartition]:
    """This month's partition and the next ``ahead`` months' of every monthly table."""
    first = month_start(now)
    last = months_after(first, ahead)
    made: list[MonthPartition] = []
    for table in MONTHLY_TABLES:
        rows = conn.execute(
            "SELECT partition_name, outcome FROM fairmeter_ensure_month_partitions(%s, %s, %s)",
            (table, first, last),
        ).fetchall()
        made.extend(MonthPartition(table, name, outcome) for name, outcome in rows)
    return made


def is_partition_of_monthly_table(name: str) -> bool:
    """A partition (monthly or default) of a monthly table: made by the database, not a
    model of its own (schema comparisons leave it out)."""
    return any(
        re.fullmatch(rf"{re.escape(table)}_(y\d{{4}}m\d{{2}}|default)", name)
        for table in MONTHLY_TABLES
    )
