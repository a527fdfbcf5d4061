"""A real Celery worker and beat with the production resume and idle windows.

The simulator puts its runs' events far enough in the past that every window has passed
when they arrive; keeping the resume window (15 min) and idle timeout (60 min) of
production means a run is never settled as abandoned while only part of it has arrived.
The settle grace is short so that a run is due as soon as its terminal event is in.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from tests.helpers.celery_worker import start_celery, stop_celery, worker_env


@pytest.fixture(scope="module")
def settling_worker(settings: Any, tmp_path_factory: Any) -> Iterator[dict[str, str]]:
    env = worker_env(
        settings,
        FAIRMETER_SETTLE_GRACE_S="1",
        FAIRMETER_RESUME_WINDOW_S="900",
        FAIRMETER_IDLE_TIMEOUT_S="3600",
    )
    redis.Redis.from_url(env["REDIS_URL"]).flushdb()
    logs = tmp_path_factory.mktemp("simulator-celery")
    hostname = f"sim-worker-{os.getpid()}@%h"
    worker = start_celery(
        ["worker", "--concurrency", "2", "--loglevel", "INFO", "--hostname", hostname],
        env,
        logs / "worker.log",
    )
    beat = start_celery(
        ["beat", "--schedule", str(logs / "beat-schedule"), "--loglevel", "INFO"],
        env,
        logs / "beat.log",
    )
    try:
        yield env
    finally:
        stop_celery(beat)
        stop_celery(worker)
