"""Fixtures of the API tests that need the API served: two processes for the live streams."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from metering.config import Settings
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
