"""bench/tiers.py counts the CPU a tier spent inside a phase: a process that starts and ends
within the phase (a PostgreSQL backend of a pool's overflow, a replaced prefork child) is
counted whole, and one that was running before counts only from the phase's start."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable

import psutil

from bench.tiers import TierCpu

# Burns ``argv[1]`` CPU seconds, says so, and exits when its stdin closes.
BURN = (
    "import sys, time\n"
    "end = time.process_time() + float(sys.argv[1])\n"
    "while time.process_time() < end: pass\n"
    "print('burnt', flush=True)\n"
    "sys.stdin.read()\n"
)


def burner(burn_s: float) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-c", BURN, str(burn_s)]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "burnt\n"
    return proc


def live(procs: list[subprocess.Popen[str]]) -> list[psutil.Process]:
    found = []
    for proc in procs:
        if proc.poll() is None:
            try:
                found.append(psutil.Process(proc.pid))
            except psutil.Error:
                continue
    return found


def until(check: Callable[[], bool], deadline_s: float = 10.0) -> None:
    deadline = time.monotonic() + deadline_s
    while not check() and time.monotonic() < deadline:
        time.sleep(0.02)


def test_a_process_born_and_gone_inside_the_phase_is_counted_whole() -> None:
    procs: list[subprocess.Popen[str]] = []
    meter = TierCpu({"tier": lambda: live(procs)}, interval_s=0.05).start()
    procs.append(burner(0.4))  # born after the first sample
    # Sampled after its burn (however loaded the machine), then gone before the end.
    # /proc counts in 10 ms ticks: 0.4 s of burn may read 0.39.
    until(lambda: meter.totals()["tier"] >= 0.35)
    procs[0].communicate(timeout=60)

    spent = meter.stop()["tier"]

    assert 0.35 <= spent < 2.0  # the interpreter's start-up on top of the burn


def test_a_process_running_before_the_phase_counts_from_its_start() -> None:
    procs = [burner(0.4)]
    meter = TierCpu({"tier": lambda: live(procs)}, interval_s=0.05).start()
    time.sleep(0.3)

    spent = meter.stop()["tier"]
    procs[0].communicate(timeout=60)

    assert spent < 0.1
