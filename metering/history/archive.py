"""Old months leave the database for Parquet files, and come back for an audit (issue #18).

A month of a monthly table is archived once its whole month is past its table's retention
(``archive_plan.py``), in this order, each step re-checked on every run:

1. every run with rows in the month is settled and not parked; else the month waits, and
   the report names the runs that hold it;
2. the month's rows are written to the archive (``archive_files.py``), unless a complete file
   (its manifest) is there already: chunk by chunk, a range of the partition's pages each,
   every chunk in a short transaction of its own (a snapshot held for the hours a large
   month takes would hold back VACUUM in the whole database). The statement that reads a
   chunk also gives each row's SQL hash (``archive_plan.SqlDigest``); the file's digest
   (``arrow_digest.py``) and the sum of the rows' SQL hashes go into the manifest;
3. the file is read back and its rows and digest must equal its manifest's;
4. in one transaction: the partition is locked, its row count and SQL digest (summed by
   PostgreSQL, one statement per chunk of pages, no row sent to Python; in READ COMMITTED
   each statement's snapshot lasts only as long as it runs) must equal the manifest's, then
   it is detached and dropped and the month recorded in ``archived_months``.

Why that proves the file holds the partition: (a) the file reads back with the digest of
exactly the batches written, made of the rows streamed; (b) each row's SQL hash came with
the row, from the same statement, so the manifest's SQL digest is that of the rows in the
file; (c) under the lock, with no writer possible, the partition has that SQL digest and
count, so it holds those rows. A row changed, added or removed between the chunks or after
them breaks (c), and so does a row that moved to another page between two chunks (missed,
or read twice). A month is immutable once past (all writes go to current months), so that
only happens by mistake; then the month is reported and stays.
A manifest of format 1, written before the SQL digest existed, has none: such a month is
compared row by row in Python under the lock, as it was before.

A crash anywhere leaves the partition in place; the next run finds the file, verifies it
and finishes. A file that disagrees with the database is never trusted and never replaced
by the archive: the month is reported and stays. ``event_keys`` is not monthly, so a
re-sent event of an archived month is still a duplicate. A restored month is dropped again
only once it equals its file; the file is not written again.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any, Final, TypeVar, cast

import psycopg
from sqlalchemy.engine import Engine

from metering.config import Settings
from metering.db import create_db_engine, raw_transaction
from metering.errors import MeteringError
from metering.history import archive_db as db
from metering.history.archive_files import ArchiveFileError, ArchiveStore, Column, Manifest
from metering.history.archive_plan import (
    Partition,
    SqlDigest,
    due_partitions,
    kept_for_audit,
    period_label,
)

_T = TypeVar("_T")
BATCH_ROWS: Final = 20_000
# Pages of the partition per chunk (8 kB each: 32 MB of heap, some 100,000 audit rows or
# 30,000 events), each chunk read in a transaction of a few seconds.
CHUNK_BLOCKS: Final = 4096
LOCK_TIMEOUT_S: Final = 10
# One archive run at a time, whoever starts it (the beat, `fairmeter archive run`).
ADVISORY_LOCK: Final = 0x66_61_69_72_61_72_63_68  # "fairarch"


@dataclass(frozen=True, slots=True)
class MonthOutcome:
    """What a run did with one month of one table."""

    table: str
    month: date
    # archived; held (unsettled runs); failed (file and database disagree); waiting (no
    # archive_url); restored (back for an audit, kept archive_restore_keep_days)
    outcome: str
    rows: int = 0
    detail: str = ""

    @property
    def period(self) -> str:
        return period_label(self.month)


@dataclass(frozen=True, slots=True)
class ArchiveReport:
    outcomes: list[MonthOutcome] = field(default_factory=list)
    busy: bool = False  # another archive run holds the lock

    def count(self, outcome: str) -> int:
        return sum(o.outcome == outcome for o in self.outcomes)


class ArchiveBusy(Exception):
    """Another archive run is under way."""


def archive_engine(settings: Settings) -> Engine:
    """The archive's own connections: as the tables' owner when ``archive_database_url``
    names it (only the owner may detach and drop a partition)."""
    url = settings.archive_database_url or settings.database_url
    return create_db_engine(settings.model_copy(update={"database_url": url, "db_pool_size": 2}))


def archive_history(
    engine: Engine, settings: Settings, now: datetime, chunk_blocks: int = CHUNK_BLOCKS
) -> ArchiveReport:
    """Archive every month past retention that can be; without ``archive_url``, only say
    which months wait (``waiting``; their rows are not counted here)."""
    if settings.archive_url is None:  # not counted: `fairmeter archive list` counts rows
        return ArchiveReport(
            [MonthOutcome(p.table, p.month, "waiting") for p in _due(engine, settings, now)]
        )
    store = ArchiveStore(settings.archive_url)
    keep = timedelta(days=settings.archive_restore_keep_days)
    try:
        with _exclusive(engine):  # listed under the lock: no other run drops one meanwhile
            due = _due(engine, settings, now)
            return ArchiveReport(
                [archive_month(engine, store, p, now, keep, chunk_blocks) for p in due]
            )
    except ArchiveBusy:
        return ArchiveReport(busy=True)


def _due(engine: Engine, settings: Settings, now: datetime) -> list[Partition]:
    with raw_transaction(engine) as conn:
        return due_partitions(db.monthly_partitions(conn), now, settings)


class _exclusive:
    """A session advisory lock on a connection of its own, held for the whole run."""

    def __init__(self, engine: Engine) -> None:
        self.connection = engine.raw_connection()

    def __enter__(self) -> None:
        driver = self.connection.driver_connection
        assert isinstance(driver, psycopg.Connection)
        self.driver: psycopg.Connection[Any] = driver
        row = driver.execute("SELECT pg_try_advisory_lock(%s)", (ADVISORY_LOCK,)).fetchone()
        driver.commit()
        if not row or not row[0]:
            self.connection.close()
            raise ArchiveBusy

    def __exit__(self, *_: object) -> None:
        try:
            self.driver.execute("SELECT pg_advisory_unlock(%s)", (ADVISORY_LOCK,))
            self.driver.commit()
        finally:
            self.connection.close()


def archive_month(
    engine: Engine,
    store: ArchiveStore,
    partition: Partition,
    now: datetime,
    keep_restored: timedelta = timedelta(0),
    chunk_blocks: int = CHUNK_BLOCKS,
) -> MonthOutcome:
    """Steps 1 to 4 of the module's contract for one partition; a month restored less than
    ``keep_restored`` ago stays for its audit."""
    table, month = partition.table, partition.month
    with raw_transaction(engine) as conn:
        cols = db.columns(conn, partition.name)
        holding = db.unsettled_runs(conn, partition, cols)
        record = db.archived_month(conn, table, month)
    if until := kept_for_audit(record.restored_at if record else None, now, keep_restored):
        return MonthOutcome(
            table, month, "restored", detail=f"kept for its audit until {until:%Y-%m-%d}"
        )
    if holding:
        return MonthOutcome(table, month, "held", detail=_runs_text(holding))
    try:
        manifest = store.manifest(table, month)
        if manifest is None and record is not None:
            return _failed(
                partition, f"archived before, but {store.data_url(table, month)} is gone"
            )
        if manifest is None:
            manifest = write_month(engine, store, partition, cols, now, chunk_blocks)
        return _verify_and_drop(engine, store, partition, manifest, now, chunk_blocks)
    except ArchiveFileError as exc:
        return _failed(partition, str(exc))


def write_month(
    engine: Engine,
    store: ArchiveStore,
    partition: Partition,
    cols: list[Column],
    now: datetime,
    chunk_blocks: int = CHUNK_BLOCKS,
) -> Manifest:
    """Step 2: the partition's rows to the archive, chunk by chunk."""
    sql_digest = SqlDigest()
    return store.write(
        table=partition.table,
        month=partition.month,
        partition=partition.name,
        columns=cols,
        batches=_read_ahead(_chunks(engine, partition, cols, chunk_blocks, sql_digest)),
        now=now,
        sql_digest=sql_digest,
    )


def _chunks(
    engine: Engine,
    partition: Partition,
    cols: list[Column],
    chunk_blocks: int,
    sql_digest: SqlDigest,
) -> Iterator[list[tuple[Any, ...]]]:
    """The partition's rows, ``chunk_blocks`` pages at a time, each chunk in a transaction of
    its own, read by one statement that also gives each row's SQL hash (added to
    ``sql_digest``): one statement, one snapshot, so the hashes are of the rows yielded.
    The last chunk runs to the heap's end, wherever it is by then."""
    with raw_transaction(engine) as conn:
        blocks = db.heap_blocks(conn, partition.name)
    for first in range(0, max(blocks, 1), chunk_blocks):
        chunk = db.Blocks(first, first + chunk_blocks if first + chunk_blocks < blocks else None)
        with raw_transaction(engine) as conn:
            for batch in db.stream_rows(
                conn, partition.name, cols, BATCH_ROWS, chunk, with_sql_hash=True
            ):
                sql_digest.add_row_hashes(row[-1] for row in batch)
                yield [row[:-1] for row in batch]


class _Failed:
    """An error of the read-ahead thread, carried to the consumer to be raised there."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


_DONE: Final = object()


def _read_ahead(batches: Iterator[_T], depth: int = 2) -> Iterator[_T]:
    """``batches``, produced on a thread of their own up to ``depth`` ahead: PostgreSQL reads
    and hashes the next batch while Python encodes and writes this one, on two cores rather
    than in turn. The producer owns its connections; an error there is raised here, and
    stopping here closes the producer (its transaction rolls back)."""
    ready: queue.Queue[object] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: object) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for batch in batches:
                if not put(batch):
                    break
        except BaseException as error:  # handed to the consumer, raised there
            put(_Failed(error))
        else:
            put(_DONE)
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()

    producer = threading.Thread(target=produce, name="archive-read-ahead", daemon=True)
    producer.start()
    try:
        while (item := ready.get()) is not _DONE:
            if isinstance(item, _Failed):
                raise item.error
            yield cast(_T, item)
    finally:
        stop.set()
        producer.join()


def _verify_and_drop(
    engine: Engine,
    store: ArchiveStore,
    partition: Partition,
    manifest: Manifest,
    now: datetime,
    chunk_blocks: int,
) -> MonthOutcome:
    read_back = store.digest(manifest)
    if (read_back.rows, read_back.hex) != (manifest.rows, manifest.digest):
        return _failed(
            partition,
            f"{store.data_url(partition.table, partition.month)} reads back {read_back.rows} "
            f"row(s), digest {read_back.hex[:12]}…; its manifest says {manifest.rows}, "
            f"{manifest.digest[:12]}…",
        )
    try:
        with raw_transaction(engine) as conn:
            db.lock_partition(conn, partition, LOCK_TIMEOUT_S)
            cols = db.columns(conn, partition.name)
            if tuple(cols) != manifest.columns:
                return _failed(partition, "the partition's columns differ from the file's")
            if holding := db.unsettled_runs(conn, partition, cols):
                return MonthOutcome(
                    partition.table, partition.month, "held", detail=_runs_text(holding)
                )
            live_rows, same = _compare_with_manifest(conn, partition.name, manifest, chunk_blocks)
            if not same:
                return _failed(
                    partition,
                    f"the database holds {live_rows} row(s), the file {manifest.rows}, or their "
                    "digests differ: the file is kept, nothing is dropped",
                )
            db.drop_partition(conn, partition)
            db.record_archived(conn, _record(store, manifest, now))
    except psycopg.errors.LockNotAvailable:
        return _failed(partition, "the table stayed locked by others; tried again next run")
    except psycopg.errors.InsufficientPrivilege:
        return _failed(
            partition,
            "verified, but this database role may not detach or drop partitions (only the "
            "tables' owner may): set FAIRMETER_ARCHIVE_DATABASE_URL to the owner's",
        )
    except psycopg.errors.ForeignKeyViolation as exc:  # rows of another table still point here
        return _failed(partition, f"cannot be detached: {exc.diag.message_primary}")
    return MonthOutcome(partition.table, partition.month, "archived", manifest.rows)


def _compare_with_manifest(
    conn: psycopg.Connection[Any], relation: str, manifest: Manifest, chunk_blocks: int
) -> tuple[int, bool]:
    """The relation's rows, and whether it holds the rows the manifest describes: by the SQL
    digest, one statement per chunk of pages, when the manifest has one; else row by row in
    Python (a manifest of format 1, written before the SQL digest existed)."""
    if manifest.sql_digest is not None:
        live_sql = db.sql_digest_in_steps(conn, relation, chunk_blocks)
        return live_sql.rows, (live_sql.rows, live_sql.hex) == (manifest.rows, manifest.sql_digest)
    live = db.relation_digest(conn, relation, manifest.columns, BATCH_ROWS)
    return live.rows, (live.rows, live.hex) == (manifest.rows, manifest.digest)


def _record(store: ArchiveStore, manifest: Manifest, now: datetime) -> db.ArchivedMonth:
    return db.ArchivedMonth(
        table=manifest.table,
        month=manifest.month,
        partition=manifest.partition,
        url=store.data_url(manifest.table, manifest.month),
        rows=manifest.rows,
        digest=manifest.digest,
        archived_at=now,
        restored_at=None,
    )


def _failed(partition: Partition, detail: str) -> MonthOutcome:
    return MonthOutcome(partition.table, partition.month, "failed", detail=detail)


def _runs_text(runs: list[tuple[str, int]], shown: int = 10) -> str:
    names = ", ".join(f"{tenant}/{run}" for tenant, run in runs[:shown])
    more = f" and {len(runs) - shown} more" if len(runs) > shown else ""
    return f"{len(runs)} unsettled run(s) hold it: {names}{more}"


# --- reading the archive and bringing a month back ---------------------------------------------


class ArchiveError(MeteringError):
    """An archive command that cannot be done as asked."""


@dataclass(frozen=True, slots=True)
class Listing:
    archived: list[db.ArchivedMonth]
    waiting: list[MonthOutcome]  # past retention, still in the database (restored ones too)


def archive_listing(engine: Engine, settings: Settings, now: datetime) -> Listing:
    """The months in the archive, and the months past retention still in the database."""
    with raw_transaction(engine) as conn:
        archived = db.archived_months(conn)
        due = due_partitions(db.monthly_partitions(conn), now, settings)
        restored = {(a.table, a.month) for a in archived if a.restored_at is not None}
        waiting = [
            MonthOutcome(
                p.table,
                p.month,
                "restored" if (p.table, p.month) in restored else "waiting",
                db.table_rows(conn, p.name),
            )
            for p in due
        ]
    return Listing(archived, waiting)


def restore_month(
    engine: Engine, settings: Settings, table: str, month: date, now: datetime
) -> db.ArchivedMonth:
    """Make the month's partition again and load its rows from the archive, exactly: the
    loaded rows must equal the file's digest, or nothing is restored."""
    if settings.archive_url is None:
        raise ArchiveError("no archive is configured: set FAIRMETER_ARCHIVE_URL", code="no_archive")
    store = ArchiveStore(settings.archive_url)
    with raw_transaction(engine) as conn:
        record = db.archived_month(conn, table, month)
        if record is None:
            raise ArchiveError(
                f"{table} {period_label(month)} is not in the archive",
                code="not_archived",
                status=404,
            )
        if db.partition_exists(conn, table, month):
            raise ArchiveError(
                f"{table} {period_label(month)} is already in the database",
                code="already_present",
                status=409,
            )
        manifest = store.manifest(table, month)
        if manifest is None or manifest.digest != record.digest:
            raise ArchiveError(
                f"{record.url} is missing or not the file archived", code="archive_file"
            )
        name, outcome = db.create_month_partition(conn, table, month)
        if outcome != "created":
            raise ArchiveError(
                f"{name} cannot be made: {outcome}", code="partition_" + outcome, status=409
            )
        try:
            db.copy_rows(conn, name, manifest.columns, store.read(manifest))
        except ArchiveFileError as exc:
            raise ArchiveError(str(exc), code="archive_file") from exc
        if not _compare_with_manifest(conn, name, manifest, CHUNK_BLOCKS)[1]:
            raise ArchiveError(
                f"{record.url} does not load back equal to its manifest", code="archive_file"
            )
        db.record_restored(conn, table, month, now)
    return record
