"""A real Celery worker and beat, as separate processes on the real Redis and PostgreSQL."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from tests.helpers.celery_worker import start_celery, stop_celery, worker_env


@pytest.fixture(scope="module")
def reconciler_processes(settings: Any, tmp_path_factory: Any) -> Iterator[dict[str, Any]]:
    """Worker (prefork, 2 children) and beat; torn down at the end of the module."""
    env = worker_env(settings)
    redis.Redis.from_url(env["REDIS_URL"]).flushdb()
    logs = tmp_path_factory.mktemp("celery")
    worker = start_celery(
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
    beat = start_celery(
        ["beat", "--schedule", str(logs / "beat-schedule"), "--loglevel", "INFO"],
        env,
        logs / "beat.log",
    )
    try:
        yield {"worker": worker, "beat": beat, "env": env, "logs": logs}
    finally:
        stop_celery(beat)
        stop_celery(worker)


@pytest.fixture(scope="module")
def webhook_worker(request: Any, settings: Any, tmp_path_factory: Any) -> Iterator[dict[str, Any]]:
    """Worker and beat for webhook tests, with the module's ``WORKER_ENV`` on top (its
    retry schedule, lease, whether loopback targets are allowed)."""
    env = worker_env(settings, **getattr(request.module, "WORKER_ENV", {}))
    redis.Redis.from_url(env["REDIS_URL"]).flushdb()
    logs = tmp_path_factory.mktemp("webhooks")
    worker = start_celery(
        [
            "worker",
            "--concurrency",
            "2",
            "--loglevel",
            "INFO",
            "--hostname",
            f"test-webhooks-{os.getpid()}@%h",
        ],
        env,
        logs / "worker.log",
    )
    beat = start_celery(
        ["beat", "--schedule", str(logs / "beat-schedule"), "--loglevel", "INFO"],
        env,
        logs / "beat.log",
    )
    try:
        yield {"worker": worker, "beat": beat, "env": env, "logs": logs}
    finally:
        stop_celery(beat)
        stop_celery(worker)


@pytest.fixture(scope="module")
def statement_beats(settings: Any, tmp_path_factory: Any) -> Iterator[dict[str, Any]]:
    """A worker and two beats that close statements every second, as soon as a month ends
    (no close delay), and settle nothing on their own (windows of 40 days): the test
    settles the runs when it chooses."""
    days_40 = str(40 * 24 * 3600)
    env = worker_env(
        settings,
        FAIRMETER_PERIOD_CLOSE_DELAY_S="0",
        FAIRMETER_STATEMENT_CLOSE_INTERVAL_S="1",
        FAIRMETER_SETTLE_GRACE_S=days_40,
        FAIRMETER_RESUME_WINDOW_S=days_40,
        FAIRMETER_IDLE_TIMEOUT_S=days_40,
    )
    redis.Redis.from_url(env["REDIS_URL"]).flushdb()
    logs = tmp_path_factory.mktemp("celery-statements")
    worker = start_celery(
        ["worker", "--concurrency", "2", "--hostname", f"statements-{os.getpid()}@%h"],
        env,
        logs / "worker.log",
    )
    beats = [
        start_celery(["beat", "--schedule", str(logs / f"beat-{n}")], env, logs / f"beat-{n}.log")
        for n in (1, 2)
    ]
    try:
        yield {"worker": worker, "beats": beats, "env": env, "logs": logs}
    finally:
        for proc in (*beats, worker):
            stop_celery(proc)
