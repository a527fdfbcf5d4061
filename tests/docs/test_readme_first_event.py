"""The README's "Sending a first event", run as written against the served API (issue #15 §3).

The curl block and the Python snippet are taken from README.md itself, with only the address
and the key's value supplied as a reader would, so the README cannot drift from what works.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from metering.policy.status import AGENT_RUNNING
from tests.helpers import ROOT

README_ADDRESS = "http://127.0.0.1:8000"


def readme_blocks(language: str) -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.DOTALL)


def first_event_block(language: str) -> str:
    return next(block for block in readme_blocks(language) if "/v1/events" in block)


def reader_env(live_server: str, key: str) -> dict[str, str]:
    return {**os.environ, "FAIRMETER_KEY": key}


def test_readme_curl_sends_an_event_of_now_that_leaves_the_run_open(live_server, make_key):
    key = make_key(tenant="acme", scope="ingest")
    script = first_event_block("bash").replace(README_ADDRESS, live_server)
    ran = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        env=reader_env(live_server, key),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    assert '"accepted":1' in ran.stdout, ran.stdout
    run: dict[str, Any] = httpx.get(
        f"{live_server}/v1/runs/run-42", headers={"authorization": f"Bearer {key}"}, timeout=10
    ).json()
    # An event of an hour ago would be settled by the next sweep ("Under review"), and one
    # of 35 days ago refused: the README's event happens now.
    happened = datetime.fromisoformat(run["last_event_at"].replace("Z", "+00:00"))
    assert abs(datetime.now(UTC) - happened) < timedelta(minutes=5), run
    assert run["status"] == AGENT_RUNNING, run


def test_readme_python_snippet_runs_as_written_with_the_key_from_the_step_before(
    live_server, make_key
):
    key = make_key(tenant="acme", scope="ingest")
    snippet = first_event_block("python").replace(README_ADDRESS, live_server)
    checked = (
        snippet.replace("httpx.post(", "reply = httpx.post(", 1)
        + "\nreply.raise_for_status()\nprint(reply.text)\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", checked],
        env=reader_env(live_server, key),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    assert '"accepted":1' in ran.stdout, ran.stdout


@pytest.mark.parametrize("language", ["bash", "python"])
def test_readme_first_event_blocks_carry_no_fixed_event_time(language):
    block = first_event_block(language)
    assert not re.search(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}", block), block
