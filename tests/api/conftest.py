"""Fixtures of the API tests that need the API served: two processes for the live streams."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from metering.config import Settings
from tests.api.heavy_harness import PATIENCE_S
from tests.security.harness import Served, serve

# Heartbeats every second (a test waits for one), a listener that reconnects at once, and
# open streams cut two seconds into a shutdown.
STREAM_ENV = {
    "FAIRMETER_STREAM_HEARTBEAT_S": "1",
    "FAIRMETER_STREAM_LISTENER_RETRY_S": "0.2",
    "FAIRMETER_SHUTDOWN_GRACE_S": "2",
}


@pytest.fixture(scope="module")
def stream_apis(settings: Settings, tmp_path_factory: Any) -> Iterator[tuple[Served, Served]]:
    """Two API processes started separately (uvicorn, one worker each), as two hosts behind a
    load balancer; the second keeps at most 4 notifications per slow client in memory."""
    logs = tmp_path_factory.mktemp("stream-apis")
    with (
        serve(settings, logs, **STREAM_ENV) as first,
        serve(settings, logs, FAIRMETER_STREAM_QUEUE_ITEMS="4", **STREAM_ENV) as second,
    ):
        yield first, second


@pytest.fixture(scope="module")
def heavy_api(settings: Settings, tmp_path_factory: Any) -> Iterator[Served]:
    """Two API processes (uvicorn workers) sharing per-tenant slots of their own, that wait
    for a lock far longer than a test does (tests/api/test_heavy_requests.py)."""
    with serve(
        settings,
        tmp_path_factory.mktemp("heavy-api"),
        workers=2,
        FAIRMETER_HEAVY_SLOTS_REDIS_PREFIX=f"fairmeter-test:slots:{uuid.uuid4().hex}",
        FAIRMETER_HEAVY_LOCK_TIMEOUT_S=str(PATIENCE_S),
        FAIRMETER_WHATIF_TIMEOUT_S=str(PATIENCE_S),
        FAIRMETER_OTLP_EXPORT_TIMEOUT_S=str(PATIENCE_S),
    ) as served:
        yield served
