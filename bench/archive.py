"""Benchmark: how fast a month of the audit log leaves for Parquet and comes back (issue #18).

A database of its own (``fairmeter_bench_archive``) gets one audit-log month 15 months old
with ``--rows`` rows (generated in SQL: texts, NULLs, jsonb, times to the microsecond). Each
round archives it end to end (``archive_history``: write, read back, compare under the
lock, drop) and restores it (``restore_month``), timed separately; the month, its file and
its bookkeeping are made anew before each round, so every round does the same work. The
host's load average is printed with each round: on a shared 2-core host, run it twice.

    uv run python bench/archive.py [--rows 1000000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.databases import drop_database, fresh_database  # noqa: E402
from metering.config import Settings  # noqa: E402
from metering.history import archive_db  # noqa: E402
from metering.history.archive import archive_engine, archive_history, restore_month  # noqa: E402
from metering.history.archive_plan import months_before  # noqa: E402
from metering.history.partitions import month_start  # noqa: E402

DATABASE = "fairmeter_bench_archive"
NOW = datetime.now(UTC)
MONTH = month_start(months_before(NOW, 15))

# Rows spread over the month, with the shapes the audit log holds.
_FILL = """
INSERT INTO audit_log (tenant_id, actor, actor_scope, action, target_type, target_id,
                       reason, before, after, created_at)
SELECT 'tenant-' || (g %% 50), 'key-' || (g %% 7), 'support', 'credit', 'run', 'run-' || g,
       CASE WHEN g %% 5 = 0 THEN NULL ELSE 'reason ''' || g || ''' é' END,
       jsonb_build_object('amount_micros', g, 'list', jsonb_build_array(1, NULL, 'x')),
       CASE WHEN g %% 3 = 0 THEN NULL ELSE jsonb_build_object('ok', g %% 2 = 0) END,
       %(first)s::timestamptz + (g %% 2419200) * interval '1 second' + (g %% 997) * interval '1 us'
FROM generate_series(1, %(rows)s) AS g
"""


def fill(url: str, rows: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for part in archive_db.monthly_partitions(conn):
            if part.month == MONTH:
                archive_db.drop_partition(conn, part)
        conn.execute("DELETE FROM archived_months")
        conn.execute(
            "SELECT fairmeter_ensure_month_partitions('audit_log', %s, %s)", (MONTH, MONTH)
        )
        first = datetime(MONTH.year, MONTH.month, 1, tzinfo=UTC)
        conn.execute(_FILL, {"first": first, "rows": rows})
        conn.execute("VACUUM ANALYZE audit_log")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    args = parser.parse_args()
    url = fresh_database(DATABASE)
    settings = Settings(
        database_url=url,
        log_json=False,
        log_level="WARNING",
        events_retention_months=13,
        history_retention_months=13,
        archive_restore_keep_days=0,
    )
    engine = archive_engine(settings)
    try:
        for round_no in range(1, args.rounds + 1):
            fill(url, args.rows)
            directory = Path(tempfile.mkdtemp(prefix="fairmeter-archive-bench-"))
            arch = settings.model_copy(update={"archive_url": str(directory)})
            load_before = os.getloadavg()[0]
            started = time.perf_counter()
            report = archive_history(engine, arch, NOW)
            archived_s = time.perf_counter() - started
            done = [(o.table, o.outcome, o.rows) for o in report.outcomes if o.rows]
            assert done == [("audit_log", "archived", args.rows)], report.outcomes
            started = time.perf_counter()
            restore_month(engine, arch, "audit_log", MONTH, NOW)
            restored_s = time.perf_counter() - started
            size_mb = sum(p.stat().st_size for p in directory.rglob("*")) / 1e6
            print(
                f"round {round_no}: {args.rows:,} rows archived in {archived_s:.1f} s "
                f"({args.rows / archived_s:,.0f} rows/s end to end), restored in "
                f"{restored_s:.1f} s ({args.rows / restored_s:,.0f} rows/s); "
                f"file {size_mb:.0f} MB; "
                f"load {load_before:.2f} before, {os.getloadavg()[0]:.2f} after",
                flush=True,
            )
            shutil.rmtree(directory)
    finally:
        engine.dispose()
        if not args.keep:
            drop_database(DATABASE)


if __name__ == "__main__":
    main()
