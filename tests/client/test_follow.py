"""``follow_run`` against the real API: the run as it is, then each change as it commits, and
across an API restart every change once, in order."""

from __future__ import annotations

import queue
import threading
from typing import Any

import pytest
from fairmeter_client import StatusEvent, StreamRefusedError, follow_run

from metering.db import raw_transaction
from metering.notifications import Notification, record
from tests.helpers.events import event
from tests.helpers.ingest import ingest

pytestmark = pytest.mark.timeout(300)


def notify(engine: Any, status: str) -> int:
    """Commit a status change of run-1, as a worker would."""
    with raw_transaction(engine) as conn:
        run_id = conn.execute("SELECT id FROM runs WHERE subject = 'run-1'").fetchone()[0]
        change = {"status": status}
        return record(
            conn, Notification("acme", "cust-1", "run.status_changed", change, run_id, "run-1")
        )


class Follower:
    """``follow_run`` on a thread, its events handed over through a queue."""

    def __init__(self, base_url: str, key: str, count: int) -> None:
        self.events: queue.Queue[StatusEvent | BaseException] = queue.Queue()

        def follow() -> None:
            try:
                for n, status in enumerate(follow_run(base_url, key, "run-1", max_backoff_s=0.5)):
                    self.events.put(status)
                    if n + 1 == count:
                        return
            except BaseException as exc:
                self.events.put(exc)

        self.thread = threading.Thread(target=follow, daemon=True)
        self.thread.start()

    def take(self, count: int, timeout_s: float = 30.0) -> list[StatusEvent]:
        found = []
        for _ in range(count):
            got = self.events.get(timeout=timeout_s)
            if isinstance(got, BaseException):
                raise got
            found.append(got)
        return found


def test_following_a_run_across_an_api_restart_gets_every_change_once_in_order(
    api_process, engine, settings, make_key, db
):
    ingest(engine, settings, [event(type="run.started", run="run-1", customer="cust-1")])
    key = make_key(tenant="acme", scope="customer", customer="cust-1")
    api_process.start()
    follower = Follower(api_process.base_url, key, count=7)
    [snapshot] = follower.take(1)
    latest = db.execute("SELECT coalesce(max(id), 0) FROM notifications").fetchone()[0]
    assert (snapshot.type, snapshot.run, snapshot.id) == ("run.status", "run-1", latest)
    assert snapshot.data["status"] == "Agent still running"

    before = [notify(engine, f"before {i}") for i in range(2)]
    seen = follower.take(2)
    assert [e.id for e in seen] == before
    assert snapshot.resume_token == str(latest)  # what a later process resumes from
    assert all(e.resume_token for e in seen)

    api_process.stop()
    while_down = [notify(engine, f"while down {i}") for i in range(3)]
    api_process.start()
    after = notify(engine, "after")

    rest = follower.take(4, timeout_s=60)
    assert [e.id for e in rest] == [*while_down, after]
    assert [e.data["status"] for e in rest] == [f"while down {i}" for i in range(3)] + ["after"]
    follower.thread.join(timeout=10)
    assert follower.events.empty()


def test_a_key_that_may_not_read_the_run_is_refused_at_once(
    api_process, engine, settings, make_key
):
    ingest(engine, settings, [event(type="run.started", run="run-1", customer="cust-1")])
    other = make_key(tenant="acme", scope="customer", customer="cust-2")
    api_process.start()
    with pytest.raises(StreamRefusedError) as refused:
        next(follow_run(api_process.base_url, other, "run-1"))
    assert (refused.value.status, refused.value.code) == (404, "run_not_found")
