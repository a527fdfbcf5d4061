"""Child processes for ``fairmeter up``: start in their own groups, supervise, stop."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import click

from metering.config import Settings

READY_TIMEOUT_S = 60.0
STOP_GRACE_S = 10.0
POLL_S = 0.2
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class StopRequested(Exception):
    """A signal asked the launcher to stop; raised only at a step boundary."""


class StopFlag:
    """Turns SIGINT/SIGTERM/SIGHUP into a flag that the launcher checks between steps."""

    def __init__(self) -> None:
        self.signal_name: str | None = None
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signal_name = signal.Signals(signum).name

    def check(self) -> None:
        if self.signal_name is not None:
            raise StopRequested(self.signal_name)

    @staticmethod
    def ignore_from_now() -> None:
        """Shutting down: a second Ctrl-C must not cut the cleanup short. ``SIG_IGN`` is also
        inherited by what the cleanup runs (``pg_ctl stop``), which shares our terminal."""
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)


@dataclass
class Child:
    """A supervised process, leader of its own process group."""

    name: str
    process: subprocess.Popen[bytes]


def explicit_fields(settings: Settings) -> set[str]:
    """Settings given by the environment (pydantic-settings marks them set), not defaults."""
    return {name for name in settings.model_fields_set if getattr(settings, name)}


# --- child processes ---------------------------------------------------------------------------


def spawn(
    name: str, argv: list[str], env: dict[str, str] | None = None, log: Path | None = None
) -> Child:
    # A session of its own: the terminal's Ctrl-C reaches only the launcher, which stops the
    # children in order, and killpg() reaches a child's own children (Celery's pool) too.
    if log is None:
        return Child(name, subprocess.Popen(argv, env=env, start_new_session=True))  # noqa: S603
    with log.open("ab") as output:  # the child keeps its own copy of the descriptor
        process = subprocess.Popen(  # noqa: S603
            argv, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
        )
    return Child(name, process)


# A line worth the terminal: a log record at WARNING or above (Celery's and Python's text
# formats, our JSON one), or the start of a traceback. Everything else goes only to the file.
NOTEWORTHY = re.compile(
    r"\b(WARNING|ERROR|CRITICAL|FATAL)\b|\"level\": \"(warning|error|critical)\"|^Traceback"
)
# Development noise that is not the user's to fix: Celery's advice against running as root
# (containers run as root) is a warning on every start.
NOT_NOTEWORTHY = re.compile(r"superuser privileges|absolutely not recommended|uid=0")


def noteworthy(line: str) -> bool:
    """Whether a child's output line belongs in the terminal as well as in its log file."""
    return bool(NOTEWORTHY.search(line)) and not NOT_NOTEWORTHY.search(line)


def spawn_logged(name: str, argv: list[str], env: dict[str, str], log: Path) -> Child:
    """A child whose whole output goes to ``log``; only warnings and errors also reach the
    terminal, prefixed with its name, so the banner is not scrolled away by INFO lines."""
    log.parent.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(  # noqa: S603
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    threading.Thread(target=_relay, args=(name, process, log), daemon=True).start()
    return Child(name, process)


def _relay(name: str, process: subprocess.Popen[bytes], log: Path) -> None:
    assert process.stdout is not None
    with log.open("ab") as output:
        for raw in process.stdout:
            output.write(raw)
            output.flush()
            line = raw.decode(errors="replace").rstrip()
            if noteworthy(line):
                print(f"[{name}] {line}", file=sys.stderr, flush=True)


def _signal_group(child: Child, signum: int) -> None:
    with suppress(ProcessLookupError):  # the group is already empty
        os.killpg(child.process.pid, signum)


def stop_children(children: list[Child]) -> None:
    """SIGTERM every group, wait up to the grace period, then SIGKILL what is left."""
    for child in children:
        _signal_group(child, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for child in children:
        try:
            child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            click.echo(f"fairmeter up: {child.name} ignored SIGTERM; killing it", err=True)
    for child in children:
        # Also sweeps a group member that outlived its leader (a Celery pool process).
        _signal_group(child, signal.SIGKILL)
        try:
            child.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            click.echo(f"fairmeter up: {child.name} (pid {child.process.pid}) survived", err=True)


def first_exited(children: list[Child]) -> Child | None:
    return next((c for c in children if c.process.poll() is not None), None)


def wait_until(ready: Callable[[], bool], what: str, children: list[Child], stop: StopFlag) -> None:
    """Poll ``ready`` until it is true; fail when a child dies or the deadline passes."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not ready():
        stop.check()
        if dead := first_exited(children):
            code = dead.process.returncode
            raise click.ClickException(f"{dead.name} exited ({code}) before {what} was ready")
        if time.monotonic() > deadline:
            raise click.ClickException(f"{what} was not ready within {READY_TIMEOUT_S:.0f}s")
        time.sleep(POLL_S)


def supervise(children: list[Child], stop: StopFlag) -> int:
    """Wait for a signal (exit code 0) or for a child to die (exit code 1)."""
    while stop.signal_name is None:
        if dead := first_exited(children):
            code = dead.process.returncode
            click.echo(f"fairmeter up: {dead.name} exited ({code}); stopping everything", err=True)
            return 1
        time.sleep(POLL_S)
    click.echo(f"fairmeter up: {stop.signal_name} received; stopping everything", err=True)
    return 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- PostgreSQL --------------------------------------------------------------------------------
