"""A real Celery worker and beat, as separate processes on the real Redis and PostgreSQL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.helpers import ROOT
from tests.helpers.processes import service_env

# A Redis database of its own, so a stray message from another suite never reaches us.
WORKER_REDIS_DB = 8 + os.getpid() % 8


def worker_env(settings: Any, **overrides: str) -> dict[str, str]:
    """The environment of a test's worker, beat and API: Redis as broker unless the test
    passes ``FAIRMETER_BROKER_URL`` (a broker set in the shell never leaks in)."""
    env = service_env(settings)
    env.pop("CELERY_BROKER_URL", None)
    env.pop("FAIRMETER_BROKER_URL", None)
    base = settings.redis_url.rsplit("/", 1)[0]
    env.update(
        REDIS_URL=f"{base}/{WORKER_REDIS_DB}",
        FAIRMETER_SETTLE_GRACE_S="1",
        FAIRMETER_RESUME_WINDOW_S="60",
        FAIRMETER_IDLE_TIMEOUT_S="120",
        FAIRMETER_SWEEP_INTERVAL_S="1",
        FAIRMETER_LOG_LEVEL="WARNING",
    )
    env.update(overrides)
    return env


def start_celery(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """``celery -A reconciler.celery_app *args`` in its own process group, output to ``log``."""
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "reconciler.celery_app", *args],
        cwd=ROOT,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def stop_celery(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group (a worker's pool children too); SIGKILL it after 20 s."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
