"""The capacity bench (bench/capacity.py, issue #18) at a tiny scale: the real API, worker,
beat, receiver and PostgreSQL run each phase, and the per-core table lands inside
docs/scaling.md's Capacity model section, the prose around it kept. The figures mean
nothing at 2,000 events; the real run is `make bench-capacity`."""

from __future__ import annotations

import os
from pathlib import Path

from bench.capacity import main

ROWS = (
    "events/s per API core",
    "events/s per PostgreSQL core",
    "runs/s per worker core",
    "runs/s per PostgreSQL core",
    "deliveries/s per worker core",
    "deliveries/s per PostgreSQL core",
)


def test_capacity_bench_writes_the_per_core_table_inside_its_section(
    database_url: str, redis_service_url: str, tmp_path: Path
) -> None:
    docs = tmp_path / "scaling.md"
    docs.write_text("# Scaling\n\n## Capacity model\n\nThe model, by hand.\n\n## After\n\nKept.\n")

    status = main(
        [
            *("--server-url", database_url, "--redis-url", redis_service_url),
            *("--database", f"fairmeter_bench_capacity_{os.getpid()}"),
            *("--events", "2000", "--deliveries", "50", "--concurrency", "1"),
            *("--idle", "1", "--timeout", "120", "--docs", str(docs)),
        ]
    )

    assert status == 0
    text = docs.read_text()
    section = text.split("## Capacity model", 1)[1].split("## After", 1)[0]
    assert "The model, by hand." in section
    assert "<!-- bench/capacity.py: generated from here -->" in section
    assert "<!-- bench/capacity.py: generated up to here -->" in section
    for row in ROWS:
        assert f"{row}**" in section, row
    assert text.endswith("## After\n\nKept.\n")
