"""`make bench-capacity` at a tiny scale: the real API, worker, receiver and PostgreSQL
still run each phase, and the per-core table lands inside docs/scaling.md's section."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

ROWS = (
    "events/s per API core",
    "events/s per PostgreSQL core",
    "runs/s per worker core",
    "runs/s per PostgreSQL core",
    "deliveries/s per worker core",
    "deliveries/s per PostgreSQL core",
)


# About a minute on an idle machine, most of it starting the API, the worker and beat.
@pytest.mark.slow
def test_capacity_bench_writes_the_per_core_table_inside_its_section(tmp_path: Path) -> None:
    docs = tmp_path / "scaling.md"
    docs.write_text("# Scaling\n\n## Capacity model\n\nThe model, by hand.\n\n## After\n\nKept.\n")
    argv = [sys.executable, "bench/capacity.py", "--events", "2000", "--deliveries", "50"]
    argv += ["--concurrency", "1", "--idle", "1", "--timeout", "120"]
    argv += ["--database", "fairmeter_test_capacity_smoke"]
    done = subprocess.run(
        [*argv, "--docs", str(docs)], cwd=ROOT, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    text = docs.read_text()
    section = text.split("## Capacity model", 1)[1].split("## After", 1)[0]
    assert "The model, by hand." in section
    assert "<!-- bench/capacity.py: generated from here -->" in section
    assert "<!-- bench/capacity.py: generated up to here -->" in section
    for row in ROWS:
        assert f"{row}**" in section, row
    assert text.endswith("## After\n\nKept.\n")
