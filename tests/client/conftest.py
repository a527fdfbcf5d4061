"""Fixtures for the client tests: an API process that can be stopped and started again, and
a spool file per test (the plain helpers are in harness.py)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from metering.config import Settings
from tests.helpers import ROOT
from tests.helpers.processes import free_port, service_env, wait_http


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
        wait_http(f"{self.base_url}/healthz")

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
