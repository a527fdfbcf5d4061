"""Fixtures of the SDK's own tests: nothing here needs a server."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def spool_path(tmp_path: Path) -> Path:
    return tmp_path / "spool.db"
