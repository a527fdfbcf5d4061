"""A real Celery worker and beat, as separate processes on the real Redis and PostgreSQL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.conftest import ROOT, service_env

# A Redis database of its own, so a stray message from another suite never reaches us.
WORKER_REDIS_DB = 8 + os.getpid() % 8


def worker_env(settings: Any, **overrides: str) -> dict[str, str]:
    env = service_env(settings)
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


def start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "reconciler.celery_app", *args],
        cwd=ROOT,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def wait_until(predicate: Any, timeout_s: float, interval_s: float = 0.25) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return bool(predicate())


@pytest.fixture(scope="module")
def reconciler_processes(settings: Any, tmp_path_factory: Any) -> Iterator[dict[str, Any]]:
    """Worker (prefork, 2 children) and beat; torn down at the end of the module."""
    env = worker_env(settings)
    redis.Redis.from_url(env["REDIS_URL"]).flushdb()
    logs = tmp_path_factory.mktemp("celery")
    worker = start(
        [
            "worker",
            "--concurrency",
            "2",
            "--loglevel",
            "INFO",
            "--hostname",
            f"test-worker-{os.getpid()}@%h",
        ],
        env,
        logs / "worker.log",
    )
    beat = start(
        ["beat", "--schedule", str(logs / "beat-schedule"), "--loglevel", "INFO"],
        env,
        logs / "beat.log",
    )
    try:
        yield {"worker": worker, "beat": beat, "env": env, "logs": logs}
    finally:
        stop(beat)
        stop(worker)
