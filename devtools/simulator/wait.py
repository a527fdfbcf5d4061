"""Waiting until the server has settled every simulated run (``GET /v1/runs/{run}``).

A run counts as settled when a decision is in force, no later evidence re-opened it, and
the server has all of its events — a run settled from part of its events (say as abandoned)
and re-opened by the rest is waited for again.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from devtools.simulator.plan import PlannedRun
from devtools.simulator.progress import bar
from devtools.simulator.send import Checkpoint

POLL_THREADS = 8
POLL_PAUSE_S = 1.0


def _is_final(reply: dict[str, Any] | None, run: PlannedRun) -> bool:
    if reply is None or not reply.get("settled") or reply.get("reopened"):
        return False
    return int(reply.get("event_count", 0)) >= len(run.events)


def _fetch(client: httpx.Client, run: PlannedRun) -> dict[str, Any] | None:
    try:
        reply = client.get(f"/v1/runs/{run.run_id}")
    except httpx.HTTPError:
        return None  # a busy or restarting API: asked again on the next round
    if reply.status_code != 200:
        return None
    body: dict[str, Any] = reply.json()
    return body


def wait_for_settlement(
    api_url: str,
    key: str,
    planned: Sequence[PlannedRun],
    *,
    timeout_s: float,
    progress: bool,
    checkpoint: Checkpoint,
) -> dict[str, dict[str, Any]]:
    """The server's view of every run, once settled or when ``timeout_s`` has passed.

    Runs not settled by then are missing from the result or shown unsettled.
    """
    latest: dict[str, dict[str, Any]] = {}
    waiting = list(planned)
    deadline = time.monotonic() + timeout_s
    headers = {"authorization": f"Bearer {key}"}
    with (
        httpx.Client(base_url=api_url, headers=headers, timeout=30) as client,
        ThreadPoolExecutor(POLL_THREADS, thread_name_prefix="fairmeter-sim-poll") as pool,
        bar("waiting for settlement", len(planned), enabled=progress) as update,
    ):
        while waiting:
            checkpoint()
            replies = list(pool.map(lambda run: _fetch(client, run), waiting))
            still = []
            for run, reply in zip(waiting, replies, strict=True):
                if reply is not None:
                    latest[run.run_id] = reply
                if not _is_final(reply, run):
                    still.append(run)
            waiting = still
            update(len(planned) - len(waiting))
            if not waiting or time.monotonic() >= deadline:
                break
            time.sleep(POLL_PAUSE_S)
    return latest


def unsettled(planned: Sequence[PlannedRun], latest: dict[str, dict[str, Any]]) -> list[str]:
    return [run.run_id for run in planned if not _is_final(latest.get(run.run_id), run)]
