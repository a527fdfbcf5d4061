"""The memory soak (bench/soak.py, issue #18) at a tiny scale: it starts the real service,
ingests, waits for settlement and reports every process. The figures themselves mean
nothing at 2,000 events; the full soak is `make bench-soak`."""

from __future__ import annotations

import os

from bench.soak import run
from bench.soak_report import table


def test_soak_reports_every_process_and_settles_every_run(database_url: str) -> None:
    results = run(
        [
            *("--database-url", database_url),
            *("--database", f"fairmeter_bench_soak_{os.getpid()}"),
            *("--events", "2000", "--batch-size", "200", "--clients", "2"),
            *("--sample-interval", "0.2", "--settle-timeout", "60", "--no-docs"),
        ]
    )

    roles = [figures.role for figures in results.figures]
    assert roles.count("API worker") == 2  # --workers 2, as production
    assert roles.count("Celery pool process") == 2  # --concurrency 2
    for one in ("API supervisor (uvicorn)", "Celery worker (main)", "Celery beat"):
        assert roles.count(one) == 1, roles
    assert all(0 < f.warm_kb <= f.peak_kb <= f.high_water_kb for f in results.figures)
    assert results.ingested["accepted"] >= 2000
    assert results.settled["runs"] == results.ingested["runs"] > 0
    assert results.every_run_settled, results.settled
    assert "Celery pool process" in table(results)
