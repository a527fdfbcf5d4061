"""Issue #8 items 2 and 3: Redis shut down with tasks queued, and Redis paused under load.

Redis only carries messages; the truth is in PostgreSQL. Ingest never touches Redis, and a
lost message only delays work: the runs it named stay claimed until the claim lease
expires, then the beat-driven sweep claims and hands them out again.
"""

from __future__ import annotations

import contextlib
import threading
import time
from datetime import UTC, datetime, timedelta

import httpx
import redis

from tests.helpers.processes import wait_until
from tests.reliability.books import Workload, all_settled, check_books, settled_runs, stored_runs
from tests.reliability.faults import customers_locked

START = datetime.now(UTC) - timedelta(minutes=30)


def queued(server) -> int:
    return int(server.client().llen("celery"))


def test_redis_shutdown_with_tasks_queued_loses_no_run_and_ingest_keeps_answering(
    settings, db, make_key, private_redis, stack
):
    first = Workload.make(300, 30, START, prefix="queued")
    during = Workload.make(200, 20, START, prefix="outage")
    env = stack.env(settings, private_redis.url(), FAIRMETER_SETTLE_CHUNK_SIZE="20")
    api = stack.api(env)
    key = make_key()
    stack.worker(env)
    stack.beat(env)
    # Both worker children block on the customers' settlement locks, so the other chunks
    # wait in Redis: the outage then destroys queued messages and unacked deliveries alike.
    with customers_locked(db.info.dsn, first.customers()):
        assert stack.ingest(api, key, first.batches(20)).start().join(60)
        assert wait_until(lambda: queued(private_redis) >= 5, timeout_s=30), "nothing queued"
        lost_messages = queued(private_redis)
        private_redis.shutdown_nosave()
        outage = stack.ingest(api, key, during.batches(10), phase="outage").start()
        ready_during_outage = httpx.get(f"{api}/readyz", timeout=10).status_code
    try:  # the blocked chunks now commit, and fail to ack: Redis is gone
        time.sleep(3)
    finally:
        private_redis.start()
        outage.phase = "after"
    assert private_redis.client().dbsize() == 0  # nothing survived: every message was lost
    assert outage.join(60), "ingest did not deliver every batch"
    assert ready_during_outage == 503
    assert outage.statuses("outage"), "no ingest ran while Redis was down"
    assert set(outage.statuses()) == {200}, outage.statuses()
    assert wait_until(lambda: all_settled(db, 500), timeout_s=90), f"{settled_runs(db)}/500"
    print(
        f"\n[faults] redis shutdown: {lost_messages} messages queued when Redis died; ingest "
        f"during the outage {outage.statuses('outage')}; readyz {ready_during_outage}"
    )
    assert lost_messages >= 5
    check_books(db, Workload({**first.kinds, **during.kinds}, first.events + during.events))


def test_redis_client_pause_under_ingest_load_answers_or_503_and_loses_nothing(
    settings, db, make_key, private_redis, stack
):
    workload = Workload.make(400, 40, START, prefix="paused")
    env = stack.env(settings, private_redis.url())
    api = stack.api(env)
    key = make_key()
    stack.worker(env)
    stack.beat(env)
    load = stack.ingest(api, key, workload.batches(4), pause_s=0.1).start()
    assert wait_until(lambda: stored_runs(db) >= 40, timeout_s=30)
    readiness: list[tuple[int | None, float]] = []
    pauser = private_redis.client(socket_timeout=20)
    try:
        pauser.execute_command("CLIENT", "PAUSE", "10000", "ALL")
        load.phase = "paused"
        probe = threading.Thread(target=probe_readiness, args=(api, readiness, 9.0))
        probe.start()
        paused_until = time.monotonic() + 10
        runs_at_pause = stored_runs(db)
        time.sleep(max(0.0, paused_until - time.monotonic()))
        runs_during_pause = stored_runs(db) - runs_at_pause
        probe.join(15)
    finally:
        # Blocks until the pause is over: CLIENT UNPAUSE waits like any other command.
        with contextlib.suppress(redis.RedisError):
            pauser.execute_command("CLIENT", "UNPAUSE")
    load.phase = "after"
    assert load.join(90), "ingest did not deliver every batch"
    paused = [a for a in load.attempts if a.phase == "paused"]
    print(
        f"\n[faults] redis pause: replies while paused {load.statuses('paused')}, slowest "
        f"{max((a.seconds for a in paused), default=0):.1f}s, runs stored meanwhile "
        f"{runs_during_pause}; readiness {sorted(set(readiness))[:6]}"
    )
    assert paused and runs_during_pause > 0, "no ingest ran while Redis was paused"
    for attempt in load.attempts:
        answered = attempt.status is not None and attempt.status < 300
        assert answered or (attempt.status == 503 and attempt.retry_after), attempt
    assert readiness and all(status in (200, 503) for status, _ in readiness), readiness
    assert wait_until(lambda: all_settled(db, 400), timeout_s=90), f"{settled_runs(db)}/400"
    check_books(db, workload)


def probe_readiness(api: str, results: list[tuple[int | None, float]], for_s: float) -> None:
    end = time.monotonic() + for_s
    while time.monotonic() < end:
        began = time.monotonic()
        try:
            status: int | None = httpx.get(f"{api}/readyz", timeout=10).status_code
        except httpx.HTTPError:
            status = None
        results.append((status, time.monotonic() - began))
        time.sleep(0.5)
