"""Concurrent requests for one run, over HTTP to the served API (two processes, group commit):
each change of its words is announced once, however many requests bring it at once."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from metering.policy.status import (
    AGENT_RUNNING,
    CONNECTION_INTERRUPTED,
    RESUMING,
    SETTLING,
)
from tests.helpers.events import event, usage

CLIENTS = 16
T0 = datetime.now(UTC) - timedelta(minutes=30)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def all_at_once(base: str, key: str, make: Callable[[int], list[dict[str, Any]]]) -> None:
    """``CLIENTS`` threads, released together, each POSTing its own batch ``make(i)``."""
    start = threading.Barrier(CLIENTS)
    headers = {
        "authorization": f"Bearer {key}",
        "content-type": "application/cloudevents-batch+json",
    }

    def client(i: int) -> None:
        body = json.dumps(make(i))
        with httpx.Client(base_url=base, headers=headers, timeout=120) as http:
            start.wait()
            reply = http.post("/v1/events", content=body)
            assert reply.status_code == 200, reply.text

    with ThreadPoolExecutor(max_workers=CLIENTS) as pool:
        list(pool.map(client, range(CLIENTS)))


def announced(db: Any, run: str = "run-1") -> list[tuple[str | None, str]]:
    rows = db.execute(
        "SELECT data->>'previous_status', data->>'status' FROM notifications "
        "WHERE subject = %s AND type = 'run.status_changed' ORDER BY id",
        (run,),
    ).fetchall()
    return [(r[0], r[1]) for r in rows]


def test_each_phase_of_a_run_announced_once_however_many_bring_it(live_server, make_key, db):
    key = make_key()
    phases: list[tuple[Callable[[int], list[dict[str, Any]]], str]] = [
        # Sixteen requests create the run at once, with usage: one "running".
        (lambda i: [usage(step=i + 1, time=at(i))], AGENT_RUNNING),
        # Sixteen drops of the server side (other ids, same meaning), and more usage.
        (
            lambda i: [
                usage(step=100 + i, time=at(20)),
                event(type="connection.lost", side="server", time=at(30 + i)),
            ],
            CONNECTION_INTERRUPTED,
        ),
        # The same resume sent by all (one id: stored once), with an old attempt's usage.
        (
            lambda i: [
                event(type="run.resumed", id="resume-2", attempt=2, time=at(60)),
                usage(step=200 + i, attempt=1, time=at(61)),
            ],
            RESUMING,
        ),
        # The new attempt's first usage, from everyone: one "running" again.
        (lambda i: [usage(step=300 + i, attempt=2, time=at(70 + i))], AGENT_RUNNING),
        # Every request ends the run (its own terminal event) while usage still comes.
        (
            lambda i: [
                usage(step=400 + i, attempt=2, time=at(90)),
                event(type="run.completed", time=at(100 + i)),
            ],
            SETTLING,
        ),
    ]
    expected: list[str] = []
    for make, words in phases:
        all_at_once(live_server, key, make)
        expected.append(words)
        assert [new for _, new in announced(db)] == expected
    said = announced(db)
    assert [old for old, _ in said] == [None, *expected[:-1]]
    stored = db.execute("SELECT event_count FROM runs").fetchone()[0]
    assert stored == CLIENTS * 7 + 1  # every event once, the shared resume once


def test_mixed_concurrent_traffic_keeps_one_chain_of_words_per_run(live_server, make_key, db):
    """Random lifecycle events for four runs from sixteen clients at once, three rounds: per
    run the announcements form one chain, each a real change, ending at the words the run
    page shows."""
    key = make_key()
    kinds = ["usage", "lost-server", "lost-client", "restored-server", "restored-client"]
    kinds += ["resumed", "heartbeat"]

    def make(round_no: int, i: int) -> list[dict[str, Any]]:
        rng = random.Random(i * 7919 + round_no)
        events = []
        for n in range(6):
            run, kind, t = f"m-{rng.randrange(4)}", rng.choice(kinds), at(rng.uniform(0, 600))
            step = round_no * 1000 + i * 10 + n
            if kind == "usage":
                events.append(usage(run=run, step=step, attempt=rng.randint(1, 3), time=t))
            elif kind == "resumed":
                events.append(event(type="run.resumed", run=run, attempt=rng.randint(2, 3), time=t))
            elif kind == "heartbeat":
                events.append(event(type="run.heartbeat", run=run, time=t))
            else:
                action, side = kind.split("-")
                type_ = "connection.lost" if action == "lost" else "connection.restored"
                events.append(event(type=type_, run=run, side=side, time=t))
        return events

    for round_no in range(3):
        all_at_once(live_server, key, lambda i, r=round_no: make(r, i))
    headers = {"authorization": f"Bearer {make_key(scope='support')}"}
    for run in ("m-0", "m-1", "m-2", "m-3"):
        said = announced(db, run)
        assert said, run
        assert [old for old, _ in said] == [None, *(new for _, new in said[:-1])], run
        assert all(old != new for old, new in said), run
        shown = httpx.get(f"{live_server}/v1/runs/{run}", headers=headers, timeout=30)
        assert said[-1][1] == shown.json()["status"], run
