"""What the client tests share besides fixtures: the source and model they report, fast
retries, Python snippets run as separate processes, and readers of what the server stored."""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import textwrap
from typing import Any

import psycopg

from tests.helpers import ROOT

SOURCE = "agent-backend/client-test"
MODEL = "agent-large-1"
FAST_RETRIES = {"backoff_base_s": 0.05, "max_backoff_s": 0.3, "timeout_s": 5.0}


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
