"""The what-if workers' dispatch (metering/settlement/replay_pool.py): a worker that comes
free takes the next shard of the tenant with the fewest running, not the oldest shard, and
a shard dropped while it waits never runs, and a dead worker fails only the shard it had.
The pool's one worker is held by a shard that
waits for a file the test writes, so the order does not depend on the machine's speed."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import CancelledError
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import pytest

from metering.settlement.replay_pool import FairPool
from tests.helpers.processes import wait_until

WAIT_S = 60.0


def started_at(release: str) -> int:
    """In a worker: once ``release`` exists, when this shard started (system-wide clock)."""
    began = time.monotonic_ns()
    deadline = time.monotonic() + WAIT_S
    while not Path(release).exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return began


@pytest.fixture
def pool() -> Iterator[FairPool]:
    fair = FairPool()
    yield fair
    fair.shutdown()


def test_a_free_worker_takes_the_shard_of_the_tenant_with_fewest_running_not_the_oldest(
    pool, tmp_path
):
    release = str(tmp_path / "release")
    big = [pool.submit("big", 1, 0, started_at, release) for _ in range(3)]
    small = pool.submit("small", 1, 0, started_at, release)
    Path(release).touch()
    starts = [future.result(WAIT_S) for future in big]
    assert starts == sorted(starts)  # one tenant's shards in the order sent
    assert starts[0] < small.result(WAIT_S) < starts[1]


def test_a_shard_cancelled_while_it_waits_never_runs(pool, tmp_path):
    release = str(tmp_path / "release")
    first = pool.submit("big", 1, 0, started_at, release)
    dropped = pool.submit("big", 1, 0, started_at, release)
    after = pool.submit("small", 1, 0, started_at, release)
    pool.cancel([dropped])
    Path(release).touch()
    assert first.result(WAIT_S) < after.result(WAIT_S)
    with pytest.raises(CancelledError):
        dropped.result(0)


def test_a_dead_worker_fails_only_its_shard_and_the_waiting_ones_run_on_new_workers(pool, tmp_path):
    release = str(tmp_path / "release")
    held = pool.submit("big", 1, 0, started_at, release)
    waiting = pool.submit("small", 1, 0, started_at, release)
    assert wait_until(lambda: pool.worker_pids(), WAIT_S), "no worker started"
    (worker,) = pool.worker_pids()
    os.kill(worker, signal.SIGKILL)
    with pytest.raises(BrokenProcessPool):
        held.result(WAIT_S)
    Path(release).touch()
    assert waiting.result(WAIT_S) > 0
    assert worker not in pool.worker_pids()
