"""Fixtures for the client tests: an API process that can be stopped and started again,
Python snippets run as separate processes, and readers of what the server stored."""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from metering.config import Settings
from tests.helpers import ROOT
from tests.helpers.processes import free_port, service_env, wait_http

SOURCE = "agent-backend/client-test"
MODEL = "agent-large-1"
FAST_RETRIES = {"backoff_base_s": 0.05, "max_backoff_s": 0.3, "timeout_s": 5.0}


class ApiProcess:
    """The real API (uvicorn, one worker) on a fixed port, stoppable and restartable."""

    def __init__(self, settings: Settings) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._env = service_env(settings)
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        assert self._proc is None, "already running"
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "cli", "serve", "--port", str(self.port)],
            cwd=ROOT,
            env=self._env,
        )
        wait_http(f"{self.base_url}/healthz", deadline_s=30)

    def stop(self) -> None:
        if self._proc is None:
            return
        self._proc.terminate()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(timeout=10)
        self._proc = None


@pytest.fixture
def api_process(settings: Settings) -> Iterator[ApiProcess]:
    api = ApiProcess(settings)
    try:
        yield api
    finally:
        api.stop()


@pytest.fixture
def spool_path(tmp_path: Path) -> Path:
    return tmp_path / "spool.db"


def start_snippet(code: str, *args: str) -> subprocess.Popen[str]:
    """Run ``code`` in a new Python process (from the repository root) with ``sys.argv``."""
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        cwd=ROOT,
        env=dict(os.environ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def read_json_line(proc: subprocess.Popen[str], deadline_s: float = 30.0) -> Any:
    """The next stdout line of ``proc`` as JSON, waiting at most ``deadline_s``."""
    assert proc.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        if not selector.select(timeout=deadline_s):
            raise TimeoutError(f"no output within {deadline_s}s")
    line = proc.stdout.readline()
    if not line:
        stderr = proc.stderr.read() if proc.stderr else ""
        raise AssertionError(f"the snippet exited without output: {stderr}")
    return json.loads(line)


def stored_events(db: psycopg.Connection[Any], source: str = SOURCE) -> list[tuple[Any, ...]]:
    """``(event_id, received_at, type)`` of every stored event of ``source``."""
    return db.execute(
        "SELECT event_id, received_at, type FROM events WHERE source = %s ORDER BY id",
        (source,),
    ).fetchall()
