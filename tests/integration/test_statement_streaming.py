"""A CSV statement of 100,000 runs streams with bounded server memory (peak RSS, not time)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import psutil

from devtools.bulk import settled_runs
from tests.helpers import ROOT
from tests.helpers.processes import free_port, service_env, wait_http

RUNS = 100_000
PEAK_GROWTH_LIMIT = 60 * 1024 * 1024


def peak_rss(pid: int) -> int:
    """VmHWM: the process's peak resident set size so far, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


def test_csv_of_100k_runs_streams_with_bounded_memory(settings, db, make_key):
    key = make_key(scope="support")
    settled_runs(db, tenant="acme", customer="big", count=RUNS, period="2026-11")
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "cli", "serve", "--port", str(port), "--workers", "1"],
        cwd=ROOT,
        env=service_env(settings),
    )
    base = f"http://127.0.0.1:{port}"
    url = f"{base}/v1/customers/big/statements/2026-11.csv"
    headers = {"authorization": f"Bearer {key}"}
    try:
        wait_http(f"{base}/healthz")
        # Warm up the code path (imports, pools) on a small statement first.
        httpx.get(f"{base}/v1/customers/big/statements/2026-10.csv", headers=headers, timeout=30)
        before = peak_rss(server.pid)
        size = lines = 0
        with httpx.stream("GET", url, headers=headers, timeout=300) as reply:
            assert reply.status_code == 200
            for chunk in reply.iter_bytes():
                size += len(chunk)
                lines += chunk.count(b"\n")
        growth = peak_rss(server.pid) - before
        assert lines == RUNS + 1  # header + one line per run
        assert size > 30 * 1024 * 1024  # far more than the memory bound
        assert growth < PEAK_GROWTH_LIMIT, f"peak RSS grew by {growth / 2**20:.0f} MiB"
        assert psutil.Process(server.pid).is_running()
    finally:
        server.terminate()
        server.wait(timeout=15)
