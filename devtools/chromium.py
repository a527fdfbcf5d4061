"""``make test``'s browser: find Chromium, or install it and say how.

The browser tests (tests/e2e) drive a headless Chromium through Playwright. On a fresh machine
there is none, and twelve tests erroring out is a poor first impression: install it through the
OS package manager where there is one (Debian's ``chromium``, which gets security updates),
else with Playwright's own installer (a build in ~/.cache/ms-playwright).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

SYSTEM_NAMES = ("chromium", "chromium-browser")


@dataclass(frozen=True)
class Machine:
    """What decides how to install: the tools there are and whether we are root."""

    apt_get: bool
    root: bool
    sudo: bool

    @staticmethod
    def this_one() -> Machine:
        return Machine(
            apt_get=shutil.which("apt-get") is not None,
            root=os.geteuid() == 0,
            sudo=shutil.which("sudo") is not None,
        )


def system_chromium() -> str | None:
    """The OS package's browser, which the browser tests prefer."""
    return next((path for name in SYSTEM_NAMES if (path := shutil.which(name))), None)


def playwright_chromium() -> str | None:
    """Playwright's own downloaded build, when it has been installed."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        path = playwright.chromium.executable_path
    return path if os.path.exists(path) else None


def install_plans(machine: Machine) -> list[list[str]]:
    """The commands to try in order: the OS package manager first, Playwright's installer last."""
    plans: list[list[str]] = []
    if machine.apt_get and (machine.root or machine.sudo):
        prefix = [] if machine.root else ["sudo", "-n"]
        update = [*prefix, "apt-get", "update", "-qq"]
        install = [*prefix, "apt-get", "install", "-y", "-qq", "chromium"]
        plans.append(
            ["sh", "-c", f"{' '.join(install)} || ({' '.join(update)} && {' '.join(install)})"]
        )
    plans.append([sys.executable, "-m", "playwright", "install", "chromium"])
    return plans


def ensure_chromium(machine: Machine) -> str:
    """The browser's path, installing it first when there is none; says what it does."""
    if found := system_chromium() or playwright_chromium():
        return found
    for plan in install_plans(machine):
        print(f"make test: no Chromium for the browser tests; installing it: {' '.join(plan)}")
        installed = subprocess.run(plan, check=False).returncode == 0  # noqa: S603
        if installed and (found := system_chromium() or playwright_chromium()):
            print(f"make test: Chromium installed at {found}")
            return found
    raise SystemExit("make test: could not install Chromium; the browser tests will fail")


if __name__ == "__main__":
    ensure_chromium(Machine.this_one())
