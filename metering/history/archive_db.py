"""What the archive reads from and does to the database: the catalog's monthly partitions,
a partition's rows, the runs that hold a month back, the drop, the restore, the bookkeeping.

Partitions are found in the catalog (``pg_inherits`` and each partition's bound), not in a
list in the code, so every monthly table is covered, whichever migration partitioned it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any, Final

import psycopg
from psycopg import sql
from psycopg.types.string import TextLoader

from metering.history.archive_files import Column, column_digest
from metering.history.archive_plan import Digest, Partition, SqlDigest, month_of_bound

# Types read as their PostgreSQL text (archive_files.py stores them so).
_AS_TEXT: Final = ("json", "jsonb", "numeric", "uuid")
# A run whose evidence is all settled and which is not parked (the sweep's PENDING, negated).
_UNSETTLED_RUNS = """
SELECT r.tenant_id, r.id FROM runs r
WHERE NOT (r.settled_evidence_version >= r.evidence_version AND r.parked_at IS NULL)
  AND EXISTS (SELECT 1 FROM {part} p WHERE p.tenant_id = r.tenant_id AND p.run_id = r.id)
ORDER BY r.tenant_id, r.id
"""
_MONTHLY_PARTITIONS = """
SELECT parent.relname, child.relname, pg_get_expr(child.relpartbound, child.oid)
FROM pg_inherits i
JOIN pg_class parent ON parent.oid = i.inhparent
JOIN pg_class child ON child.oid = i.inhrelid
JOIN pg_namespace n ON n.oid = parent.relnamespace
WHERE n.nspname = 'public' AND parent.relkind = 'p'
ORDER BY parent.relname, child.relname
"""


def monthly_partitions(conn: psycopg.Connection[Any]) -> list[Partition]:
    """Every partition that covers exactly one UTC month; default partitions are not."""
    conn.execute("SET LOCAL TimeZone = 'UTC'")  # bounds are printed in the session's zone
    found = []
    for table, name, bound in conn.execute(_MONTHLY_PARTITIONS).fetchall():
        month = month_of_bound(bound)
        if month is not None:
            found.append(Partition(table, name, month))
    return found


def columns(conn: psycopg.Connection[Any], relation: str) -> list[Column]:
    rows = conn.execute(
        "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
        "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
        (relation,),
    ).fetchall()
    return [Column(name, pg_type) for name, pg_type in rows]


def unsettled_runs(
    conn: psycopg.Connection[Any], partition: Partition, cols: Sequence[Column]
) -> list[tuple[str, int]]:
    """The runs with rows in the partition that are not settled (none for a table without
    runs). Few runs are unsettled at any time, so this probes the partition per such run."""
    if "run_id" not in {c.name for c in cols}:
        return []
    query = sql.SQL(_UNSETTLED_RUNS).format(part=sql.Identifier(partition.name))
    return [(tenant, run) for tenant, run in conn.execute(query).fetchall()]


@dataclass(frozen=True, slots=True)
class Blocks:
    """A range of the relation's heap pages, ``[first, end)``; ``end`` None: to the last page,
    however many there are by then. Read by a TID range scan (``ctid >= '(first,0)'``), which
    reads those pages and nothing else, whatever the table's keys."""

    first: int
    end: int | None

    def where(self) -> sql.Composable:
        lower = sql.SQL("ctid >= {}::tid").format(sql.Literal(f"({self.first},0)"))
        if self.end is None:
            return sql.SQL(" WHERE ") + lower
        upper = sql.SQL("ctid < {}::tid").format(sql.Literal(f"({self.end},0)"))
        return sql.SQL(" WHERE ") + lower + sql.SQL(" AND ") + upper


def heap_blocks(conn: psycopg.Connection[Any], relation: str) -> int:
    """How many pages the relation's heap has now."""
    row = conn.execute(
        "SELECT pg_relation_size(%s::regclass) / current_setting('block_size')::int",
        (relation,),
    ).fetchone()
    return int(row[0]) if row else 0


def stream_rows(
    conn: psycopg.Connection[Any],
    relation: str,
    cols: Sequence[Column],
    batch_rows: int,
    blocks: Blocks | None = None,
    *,
    with_sql_hash: bool = False,
) -> Iterator[list[tuple[Any, ...]]]:
    """The relation's rows (those of ``blocks`` only, when given) in batches, through a
    server-side cursor (in the caller's transaction), with the values archive_files.py
    stores. ``with_sql_hash``: each row ends with one more value, the SHA-256 of its text
    (the SQL digest's row hash), taken by the same statement, so of the same row."""
    selected: list[sql.Composable] = [sql.Identifier("t", c.name) for c in cols]
    if with_sql_hash:
        use_canonical_text(conn)
        selected.append(sql.SQL(_SQL_ROW_HASH))
    query = sql.SQL("SELECT {} FROM {} AS t").format(
        sql.SQL(", ").join(selected), sql.Identifier(relation)
    )
    if blocks is not None:
        query += blocks.where()
    with conn.cursor(name=f"archive_{relation}") as cursor:
        for type_name in _AS_TEXT:
            cursor.adapters.register_loader(type_name, TextLoader)
        cursor.execute(query)
        while batch := cursor.fetchmany(batch_rows):
            yield batch


def relation_digest(
    conn: psycopg.Connection[Any], relation: str, cols: Sequence[Column], batch_rows: int
) -> Digest:
    digest = column_digest(cols)
    for batch in stream_rows(conn, relation, cols, batch_rows):
        digest.add(batch)
    return digest


# The text of a row depends on these settings (times in the session's zone, float digits,
# bytea's output): fixed for every SQL digest, so the same rows always give the same text.
_CANONICAL_TEXT: Final = (
    "SET LOCAL TimeZone = 'UTC'",
    "SET LOCAL DateStyle = 'ISO, YMD'",
    "SET LOCAL IntervalStyle = 'postgres'",
    "SET LOCAL extra_float_digits = 1",
    "SET LOCAL bytea_output = 'hex'",
)
# A row's hash for the SQL digest: SHA-256 of its text.
_SQL_ROW_HASH: Final = "sha256(convert_to(t::text, 'UTF8'))"
# Each row's hash, its first 16 bytes summed as two signed 64-bit integers (as
# ``SqlDigest.add_row_hashes`` does): in C, no row leaves the server; a sum, so it does not
# depend on row order.
_SQL_DIGEST: Final = f"""
SELECT count(*),
       coalesce(sum(('x' || substr(h, 1, 16))::bit(64)::bigint), 0),
       coalesce(sum(('x' || substr(h, 17, 16))::bit(64)::bigint), 0)
FROM (SELECT encode({_SQL_ROW_HASH}, 'hex') AS h FROM {{}} AS t{{}}) AS hashed
"""


def use_canonical_text(conn: psycopg.Connection[Any]) -> None:
    """Fix, for the caller's transaction, every setting a row's text depends on."""
    for setting in _CANONICAL_TEXT:
        conn.execute(setting)


def sql_digest(
    conn: psycopg.Connection[Any], relation: str, blocks: Blocks | None = None
) -> SqlDigest:
    """The relation's rows (those of ``blocks`` only) and their SQL digest
    (``archive_plan.SqlDigest``), in one statement of the caller's transaction."""
    use_canonical_text(conn)
    where = blocks.where() if blocks is not None else sql.SQL("")
    row = conn.execute(sql.SQL(_SQL_DIGEST).format(sql.Identifier(relation), where)).fetchone()
    assert row is not None
    digest = SqlDigest()
    digest.add(int(row[0]), int(row[1]), int(row[2]))
    return digest


def sql_digest_in_steps(
    conn: psycopg.Connection[Any], relation: str, step_blocks: int
) -> SqlDigest:
    """The relation's rows and SQL digest, as one statement per ``step_blocks`` pages in the
    caller's transaction. Under the archive's SHARE lock the relation cannot change between
    them, and in READ COMMITTED a statement's snapshot is held only while it runs: the
    compare of a large month does not hold back VACUUM's horizon for its whole length."""
    whole = SqlDigest()
    blocks = heap_blocks(conn, relation)
    for first in range(0, max(blocks, 1), step_blocks):
        end = first + step_blocks if first + step_blocks < blocks else None
        whole.merge(sql_digest(conn, relation, Blocks(first, end)))
    return whole


def lock_partition(
    conn: psycopg.Connection[Any], partition: Partition, lock_timeout_s: int
) -> None:
    """Hold the partition against any change until the transaction ends; readers (a
    statement of an old month, a replay) still read it while it is compared. Detaching then
    takes the parent's ACCESS EXCLUSIVE lock: waiting for it is bounded, so the archive never
    queues writers behind itself for long; it tries again next time."""
    conn.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(f"{lock_timeout_s}s")))
    conn.execute(sql.SQL("LOCK TABLE {} IN SHARE MODE").format(sql.Identifier(partition.name)))


def drop_partition(conn: psycopg.Connection[Any], partition: Partition) -> None:
    conn.execute(
        sql.SQL("ALTER TABLE {} DETACH PARTITION {}").format(
            sql.Identifier(partition.table), sql.Identifier(partition.name)
        )
    )
    conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(partition.name)))


@dataclass(frozen=True, slots=True)
class ArchivedMonth:
    """A row of ``archived_months``."""

    table: str
    month: date
    partition: str
    url: str
    rows: int
    digest: str
    archived_at: datetime
    restored_at: datetime | None


_ARCHIVED_COLUMNS = "table_name, month, partition_name, url, rows, digest, archived_at, restored_at"


def archived_months(conn: psycopg.Connection[Any]) -> list[ArchivedMonth]:
    rows = conn.execute(
        f"SELECT {_ARCHIVED_COLUMNS} FROM archived_months ORDER BY month, table_name"
    ).fetchall()
    return [ArchivedMonth(*row) for row in rows]


def archived_month(conn: psycopg.Connection[Any], table: str, month: date) -> ArchivedMonth | None:
    row = conn.execute(
        f"SELECT {_ARCHIVED_COLUMNS} FROM archived_months WHERE table_name = %s AND month = %s",
        (table, month),
    ).fetchone()
    return ArchivedMonth(*row) if row else None


def record_archived(conn: psycopg.Connection[Any], month: ArchivedMonth) -> None:
    """The month is in the archive and out of the database (again, after a restore)."""
    conn.execute(
        f"INSERT INTO archived_months ({_ARCHIVED_COLUMNS}) "
        "VALUES (%s, %s, %s, %s, %s, %s, %s, NULL) "
        "ON CONFLICT (table_name, month) DO UPDATE SET archived_at = EXCLUDED.archived_at, "
        "restored_at = NULL, url = EXCLUDED.url",
        (
            month.table,
            month.month,
            month.partition,
            month.url,
            month.rows,
            month.digest,
            month.archived_at,
        ),
    )


def record_restored(conn: psycopg.Connection[Any], table: str, month: date, now: datetime) -> None:
    conn.execute(
        "UPDATE archived_months SET restored_at = %s WHERE table_name = %s AND month = %s",
        (now, table, month),
    )


def partition_exists(conn: psycopg.Connection[Any], table: str, month: date) -> bool:
    return any(p.table == table and p.month == month for p in monthly_partitions(conn))


def create_month_partition(
    conn: psycopg.Connection[Any], table: str, month: date
) -> tuple[str, str]:
    """The month's partition, made by the one SQL definition (migration 0023): its name and
    ``created``, ``exists`` or ``blocked``."""
    row = conn.execute(
        "SELECT partition_name, outcome FROM fairmeter_ensure_month_partitions(%s, %s, %s)",
        (table, month, month),
    ).fetchone()
    assert row is not None
    return str(row[0]), str(row[1])


def copy_rows(
    conn: psycopg.Connection[Any],
    relation: str,
    cols: Sequence[Column],
    batches: Iterable[Sequence[tuple[Any, ...]]],
) -> int:
    """Load rows into ``relation`` with COPY (the append-only trigger refuses only UPDATE
    and DELETE)."""
    statement = sql.SQL("COPY {} ({}) FROM STDIN").format(
        sql.Identifier(relation), sql.SQL(", ").join(sql.Identifier(c.name) for c in cols)
    )
    loaded = 0
    with conn.cursor() as cursor, cursor.copy(statement) as copy:
        for batch in batches:
            for row in batch:
                copy.write_row(row)
                loaded += 1
    return loaded


def table_rows(conn: psycopg.Connection[Any], relation: str) -> int:
    row = conn.execute(
        sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(relation))
    ).fetchone()
    return int(row[0]) if row else 0
