"""Sending the planned traffic through the client (``fairmeter_client.Meter``), as an agent would.

The calls of all runs are made in time order, interleaved like concurrent runs, on
``Meter.run`` reporters; the Meter spools them in a temporary SQLite file and its flusher
thread delivers them in batches. Each call's returned id is checked against the plan, so
the server receives exactly the events the expectations were computed from.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from fairmeter_client import DeadLetter, Meter, Run

from devtools.simulator.plan import PlannedRun
from devtools.simulator.progress import bar

Checkpoint = Callable[[], None]  # raises to stop the simulation (Ctrl-C in `fairmeter up`)


@dataclass
class Delivery:
    events: int = 0
    accepted: int = 0
    duplicates: int = 0
    undelivered: int = 0  # still spooled when the deadline passed
    dead_letters: list[DeadLetter] = field(default_factory=list)
    elapsed_s: float = 0.0  # spooling and delivering


def _spool_calls(meter: Meter, planned: Sequence[PlannedRun], checkpoint: Checkpoint) -> int:
    reporters: dict[str, Run] = {}
    order = sorted(
        (call.at, run.index, position, run)
        for run in planned
        for position, call in enumerate(run.scenario.calls)
    )
    for count, (_, _, position, run) in enumerate(order):
        if count % 500 == 0:
            checkpoint()
        scenario = run.scenario
        reporter = reporters.get(scenario.run_id)
        if reporter is None:
            reporter = reporters[scenario.run_id] = meter.run(
                scenario.run_id, customer=scenario.customer
            )
        call = scenario.calls[position]
        event_id = getattr(reporter, call.method)(**call.kwargs)
        if event_id != run.events[position]["id"]:
            raise AssertionError(f"{scenario.run_id}: the client made another event id")
    return len(order)


def send_traffic(
    api_url: str,
    key: str,
    planned: Sequence[PlannedRun],
    *,
    source: str,
    timeout_s: float,
    progress: bool,
    checkpoint: Checkpoint,
) -> Delivery:
    """Spool every planned call, then deliver; returns what the server took or refused."""
    delivery = Delivery()
    with tempfile.TemporaryDirectory(prefix="fairmeter-sim-") as spool_dir:
        meter = Meter(
            api_url,
            key,
            source=source,
            spool_path=Path(spool_dir) / "spool.db",
            synchronous="NORMAL",  # a scratch spool: speed over surviving power loss
            backoff_base_s=0.2,
            max_backoff_s=5.0,
            start=False,  # full batches: spool everything first
        )
        try:
            delivery.events = _spool_calls(meter, planned, checkpoint)
            meter.start()
            _wait_delivered(meter, delivery.events, timeout_s, progress, checkpoint)
        finally:
            stats = meter.stats()
            delivery.dead_letters = meter.dead_letters(limit=1000)
            meter.close(timeout=0.5)
        delivery.accepted, delivery.duplicates = stats.accepted, stats.duplicates
        delivery.undelivered = stats.pending_events
    return delivery


def _wait_delivered(
    meter: Meter, total: int, timeout_s: float, progress: bool, checkpoint: Checkpoint
) -> None:
    deadline = time.monotonic() + timeout_s
    with bar("sending events", total, enabled=progress) as update:
        while time.monotonic() < deadline:
            checkpoint()
            stats = meter.stats()
            update(total - stats.pending_events)
            if meter.flush(timeout=0.5):  # raises MeterConfigError for a bad key or URL
                update(total)
                return


def settle_now(
    api_url: str,
    support_key: str,
    planned: Sequence[PlannedRun],
    *,
    progress: bool,
    checkpoint: Checkpoint,
) -> dict[str, str]:
    """Ask the server to settle every run now (support key), oldest end first.

    Returns the runs it refused, with the reply.
    """
    refused: dict[str, str] = {}
    ordered = sorted(planned, key=lambda run: (run.ended_at, run.index))
    headers = {"authorization": f"Bearer {support_key}"}
    with (
        httpx.Client(base_url=api_url, headers=headers, timeout=30) as client,
        bar("settling now", len(ordered), enabled=progress) as update,
    ):
        for done, run in enumerate(ordered, start=1):
            reply = _post_retrying(client, f"/v1/support/runs/{run.run_id}/settle", checkpoint)
            if reply.status_code != 200:
                refused[run.run_id] = f"{reply.status_code} {reply.text[:200]}"
            update(done)
    return refused


def _post_retrying(
    client: httpx.Client, path: str, checkpoint: Checkpoint, attempts: int = 5
) -> httpx.Response:
    """POST, trying again after a rate limit (429) or a server error, as Retry-After says."""
    checkpoint()
    reply = client.post(path)
    for attempt in range(1, attempts):
        if reply.status_code != 429 and reply.status_code < 500:
            break
        try:
            pause_s = float(reply.headers.get("retry-after", ""))
        except ValueError:
            pause_s = 0.5 * attempt
        time.sleep(min(pause_s, 10.0))
        checkpoint()
        reply = client.post(path)
    return reply


def no_checkpoint() -> None:
    """Never stops the simulation."""
