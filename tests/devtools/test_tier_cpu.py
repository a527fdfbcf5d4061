"""bench/tiers.py counts the CPU a tier spent inside a phase: a process that starts and ends
within the phase (a PostgreSQL backend of a pool's overflow, a replaced prefork child) is
counted whole, and one that was running before counts only from the phase's start."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from bench.tiers import TierCpu

# Burns ``argv[1]`` CPU seconds, then idles ``argv[2]`` seconds (long enough to be sampled).
BURN = (
    "import sys, time\n"
    "end = time.process_time() + float(sys.argv[1])\n"
    "while time.process_time() < end: pass\n"
    "print('burnt', flush=True)\n"
    "time.sleep(float(sys.argv[2]))\n"
)


def burner(burn_s: float, idle_s: float) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-c", BURN, str(burn_s), str(idle_s)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)


def live(procs: list[subprocess.Popen[str]]) -> list[psutil.Process]:
    found = []
    for proc in procs:
        if proc.poll() is None:
            try:
                found.append(psutil.Process(proc.pid))
            except psutil.Error:
                continue
    return found


def test_a_process_born_and_gone_inside_the_phase_is_counted_whole() -> None:
    procs: list[subprocess.Popen[str]] = []
    meter = TierCpu({"tier": lambda: live(procs)}, interval_s=0.05).start()
    time.sleep(0.05)  # so the process is born after the phase began
    procs.append(burner(0.4, 0.3))
    procs[0].communicate(timeout=60)

    spent = meter.stop()["tier"]

    assert 0.4 <= spent < 1.0  # the interpreter's start-up on top of the burn


def test_a_process_running_before_the_phase_counts_from_its_start() -> None:
    procs = [burner(0.4, 1.5)]
    assert procs[0].stdout is not None and procs[0].stdout.readline() == "burnt\n"
    meter = TierCpu({"tier": lambda: live(procs)}, interval_s=0.05).start()
    time.sleep(0.3)

    spent = meter.stop()["tier"]
    procs[0].communicate(timeout=60)

    assert spent < 0.1
