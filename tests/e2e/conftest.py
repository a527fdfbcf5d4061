"""Browser tests: one headless Chromium per session (tests/helpers/browser.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ROOT
from tests.helpers.browser import chromium

ARTIFACTS = ROOT / "test-artifacts"


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    with chromium() as instance:
        yield instance


@pytest.fixture
def artifacts() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS
