"""`make test` installs the browser tests' Chromium when it is missing (issue #15 §1)."""

from __future__ import annotations

import subprocess
import sys

from devtools.chromium import Machine, install_plans, system_chromium
from tests.helpers import ROOT


def test_make_test_installs_the_browser_before_running_the_suite():
    planned = subprocess.run(
        ["make", "-n", "test"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    lines = planned.splitlines()
    browser = next(i for i, line in enumerate(lines) if "devtools.chromium" in line)
    suite = next(i for i, line in enumerate(lines) if line.rstrip().endswith("pytest"))
    assert browser < suite, planned


def test_chromium_comes_from_the_os_package_manager_where_there_is_one():
    first, last = install_plans(Machine(apt_get=True, root=True, sudo=False))
    assert "apt-get install -y -qq chromium" in first[-1]
    assert not first[-1].startswith("sudo")
    assert last == [sys.executable, "-m", "playwright", "install", "chromium"]


def test_a_user_with_sudo_installs_the_package_through_it():
    first, _ = install_plans(Machine(apt_get=True, root=False, sudo=True))
    assert first[-1].startswith("sudo -n apt-get install")


def test_without_a_package_manager_playwright_installs_its_own_build():
    for machine in (
        Machine(apt_get=False, root=True, sudo=True),
        Machine(apt_get=True, root=False, sudo=False),
    ):
        assert install_plans(machine) == [
            [sys.executable, "-m", "playwright", "install", "chromium"]
        ]


def test_an_installed_chromium_is_found_and_nothing_is_installed():
    found = system_chromium()
    ran = subprocess.run(
        [sys.executable, "-m", "devtools.chromium"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    if found is not None:  # this machine has the OS package: nothing to say or do
        assert "installing" not in ran.stdout, ran.stdout
