"""The service's own processes in tests: a free port, their environment, waiting for them."""

from __future__ import annotations

import os
import socket
import time
from typing import Any

import httpx

from metering.config import Settings


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def service_env(settings: Settings) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DATABASE_URL=settings.database_url,
        REDIS_URL=settings.redis_url,
        FAIRMETER_KEY_PEPPER=settings.key_pepper,
        FAIRMETER_LOG_LEVEL="WARNING",
    )
    return env


# A served API on this 2-core shared machine has taken over 30 s to answer under load (two
# uvicorn workers, each importing the app): wait generously, the happy path returns at once.
START_DEADLINE_S = 180.0


def wait_http(url: str, deadline_s: float = START_DEADLINE_S) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer within {deadline_s}s")


def wait_until(predicate: Any, timeout_s: float, interval_s: float = 0.25) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return bool(predicate())
