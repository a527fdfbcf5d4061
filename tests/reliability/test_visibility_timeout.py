"""Issue #8 item 6: a visibility timeout shorter than a task's run time.

Redis then hands a task that is still running to another worker process: the same message
runs twice, concurrently. The settlement task locks its customers and runs and re-reads
them, so the second execution finds the runs decided and does nothing.
"""

from __future__ import annotations

import re
from collections import defaultdict
from datetime import UTC, datetime, timedelta

from tests.helpers.ingest import ingest
from tests.helpers.processes import wait_until
from tests.reliability.books import Workload, all_settled, check_books, settled_runs
from tests.reliability.faults import customers_locked

START = datetime.now(UTC) - timedelta(minutes=30)
RECEIVED = re.compile(r"Task fairmeter\.settle_run_chunk\[([0-9a-f-]+)\] received")
SUCCEEDED = re.compile(r"Task fairmeter\.settle_run_chunk\[([0-9a-f-]+)\] succeeded in \S+: (\d+)")


def executions(log: str) -> tuple[dict[str, int], dict[str, list[int]]]:
    """Per task id: how often it was received, and what each finished execution returned
    (the number of runs it decided)."""
    received: dict[str, int] = defaultdict(int)
    results: dict[str, list[int]] = defaultdict(list)
    for task_id in RECEIVED.findall(log):
        received[task_id] += 1
    for task_id, decided in SUCCEEDED.findall(log):
        results[task_id].append(int(decided))
    return received, results


def test_settle_task_delivered_again_while_running_has_a_single_effect(
    engine, settings, db, private_redis, stack
):
    workload = Workload.make(60, 6, START, prefix="visible")
    env = stack.env(
        settings,
        private_redis.url(),
        FAIRMETER_BROKER_VISIBILITY_TIMEOUT_S="2",
        FAIRMETER_CLAIM_LEASE_S="300",  # only the broker redelivers here, never the sweep
    )
    # The task runs as long as the test holds its customers' locks: well past the timeout.
    with customers_locked(db.info.dsn, workload.customers()):
        for batch in workload.batches(30):
            ingest(engine, settings, batch)
        stack.worker(env)
        stack.beat(env)

        def delivered_twice() -> bool:
            received, _ = executions(stack.log("worker"))
            return max(received.values(), default=0) >= 2

        assert wait_until(delivered_twice, timeout_s=45), "the task was never redelivered"
    assert wait_until(lambda: all_settled(db, 60), timeout_s=60), f"{settled_runs(db)}/60"
    received, results = executions(stack.log("worker"))
    task_id = max(received, key=lambda t: received[t])

    def all_finished() -> bool:
        _, results = executions(stack.log("worker"))
        return len(results[task_id]) >= 2

    assert wait_until(all_finished, timeout_s=30)
    _, results = executions(stack.log("worker"))
    print(
        f"\n[faults] visibility: task {task_id} received {received[task_id]}x, "
        f"runs decided per execution {results[task_id]}"
    )
    assert sorted(results[task_id])[-1] == 60 and sum(results[task_id]) == 60
    check_books(db, workload)
