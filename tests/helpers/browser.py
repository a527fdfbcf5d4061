"""Headless Chromium driven by Playwright for Python: the OS package's when there is one, else
Playwright's own build (``make test`` installs one of them when neither is there)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest


@contextmanager
def chromium() -> Iterator[Any]:
    from devtools.chromium import playwright_chromium, system_chromium

    executable = system_chromium() or playwright_chromium()
    if executable is None:
        pytest.fail(
            "no Chromium for the browser tests: `make test` installs it (or run "
            "`uv run python -m devtools.chromium`)"
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        instance = playwright.chromium.launch(
            executable_path=executable,
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        try:
            yield instance
        finally:
            instance.close()
