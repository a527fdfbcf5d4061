"""The key pepper: served processes refuse a published or short one; `make up` makes its own."""

from __future__ import annotations

import stat
import subprocess
import sys

import pytest

from devtools.launcher import state_pepper
from metering.config import DEFAULT_KEY_PEPPER, MIN_KEY_PEPPER_BYTES, Settings
from tests.helpers import ROOT
from tests.helpers.processes import free_port, service_env

pytestmark = pytest.mark.timeout(180)

CELERY = (sys.executable, "-m", "celery", "-A", "reconciler.celery_app")
PROCESSES = {
    "api": (sys.executable, "-m", "cli", "serve", "--port"),  # + a free port
    "worker": (*CELERY, "worker", "--pool", "solo", "--loglevel", "INFO"),
    "beat": (*CELERY, "beat", "--loglevel", "INFO", "--schedule"),  # + a schedule file
}
WEAK_PEPPERS = {
    "code default": DEFAULT_KEY_PEPPER,
    "compose placeholder": "set-a-long-random-pepper",
    "31 bytes": "x" * (MIN_KEY_PEPPER_BYTES - 1),
}


@pytest.mark.parametrize("weakness", WEAK_PEPPERS)
@pytest.mark.parametrize("process", PROCESSES)
def test_served_processes_refuse_a_published_or_short_pepper_with_one_line(
    settings, tmp_path, process, weakness
):
    argv = [*PROCESSES[process]]
    if process == "api":
        argv.append(str(free_port()))
    if process == "beat":
        argv.append(str(tmp_path / "celerybeat-schedule"))
    env = service_env(settings) | {"FAIRMETER_KEY_PEPPER": WEAK_PEPPERS[weakness]}
    done = subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode != 0, done.stdout + done.stderr
    said = [line for line in done.stderr.splitlines() if "FAIRMETER_KEY_PEPPER" in line]
    assert len(said) == 1, done.stderr
    assert said[0].startswith(f"fairmeter {'serve' if process == 'api' else process}: refusing")
    assert "at least 32 bytes" in said[0] and "secrets.token_urlsafe" in said[0]
    assert WEAK_PEPPERS[weakness] not in done.stdout + done.stderr  # a secret is never echoed


def test_make_up_generates_a_pepper_once_and_keeps_it_across_restarts(tmp_path):
    first = state_pepper(Settings(), tmp_path)
    again = state_pepper(Settings(), tmp_path)
    assert first.key_pepper == again.key_pepper
    assert len(first.key_pepper.encode()) >= MIN_KEY_PEPPER_BYTES
    (tmp_path / "other").mkdir()
    assert first.key_pepper != state_pepper(Settings(), tmp_path / "other").key_pepper
    mode = (tmp_path / "key-pepper").stat().st_mode
    assert stat.S_IMODE(mode) == 0o600  # only its owner may read it


def test_make_up_uses_the_pepper_it_is_given(tmp_path):
    given = "g" * 48
    assert state_pepper(Settings(key_pepper=given), tmp_path).key_pepper == given
    assert not (tmp_path / "key-pepper").exists()
