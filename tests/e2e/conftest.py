"""Browser tests: a tab of the module's headless Chromium (``browser`` in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ROOT

ARTIFACTS = ROOT / "test-artifacts"
WAIT_MS = 10_000  # per browser step; generous, the test machine is shared


@pytest.fixture
def artifacts() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh browser tab (its own cookies) at a desktop width."""
    context = browser.new_context(viewport={"width": 1280, "height": 1000})
    tab = context.new_page()
    tab.set_default_timeout(WAIT_MS)
    try:
        yield tab
    finally:
        context.close()
