"""Issue #18: Celery on RabbitMQ quorum queues, against what the Redis transport got wrong.

Each test runs in a private virtual host of the machine's RabbitMQ (``rabbit_vhost``); the
database truths (every run settled once, the books balanced) are checked as for Redis.

- Redis hands a task that is still running to another worker once its visibility timeout
  passes (``test_visibility_timeout.py`` shows the duplicate being harmless); RabbitMQ
  redelivers only when the holder's connection goes away, so it never does.
- Redis shut down loses every queued message (``test_redis_outage.py``); RabbitMQ closing
  every connection, as a restart does, keeps them in the quorum queue and puts the
  deliveries nobody acknowledged back.
- A message that kills its worker every time is moved to the dead-letter queue after the
  delivery limit, instead of being redelivered forever.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import amqp
import httpx
import pytest

from reconciler.broker import DEAD_LETTER_QUEUE, TASK_QUEUE
from reconciler.celery_app import create_celery
from tests.helpers.ingest import ingest
from tests.helpers.processes import wait_until
from tests.helpers.rabbitmq import HOST, PASSWORD, RESTART_ALLOWED, USER, restart_node
from tests.reliability.books import Workload, all_settled, check_books, settled_runs
from tests.reliability.faults import children_in_transaction, customers_locked
from tests.reliability.poison import POISON_TASK
from tests.reliability.test_visibility_timeout import executions

START = datetime.now(UTC) - timedelta(minutes=30)
OLD_VISIBILITY_TIMEOUT_S = 2


def test_task_running_past_the_old_visibility_timeout_is_delivered_once(
    engine, settings, db, private_redis, rabbit_vhost, stack
):
    workload = Workload.make(60, 6, START, prefix="visible")
    env = stack.env(
        settings,
        private_redis.url(),
        rabbit_vhost.url(),
        # What made Redis deliver the same task twice (test_visibility_timeout.py): ignored
        # by RabbitMQ, which has no visibility timeout.
        FAIRMETER_BROKER_VISIBILITY_TIMEOUT_S=str(OLD_VISIBILITY_TIMEOUT_S),
        FAIRMETER_CLAIM_LEASE_S="300",  # only the broker could redeliver here, never the sweep
    )
    with customers_locked(db.info.dsn, workload.customers()):
        for batch in workload.batches(30):
            ingest(engine, settings, batch)
        worker = stack.worker(env)
        stack.beat(env)
        assert wait_until(
            lambda: children_in_transaction(worker, db, waiting_on_a_lock=True),
            timeout_s=45,
        ), "the settle task never started"
        blocked_at = time.monotonic()
        # The task runs ten times the old timeout: Redis redelivered it within one.
        time.sleep(10 * OLD_VISIBILITY_TIMEOUT_S)
        held_s = time.monotonic() - blocked_at
    assert wait_until(lambda: all_settled(db, 60), timeout_s=60), f"{settled_runs(db)}/60"

    def chunk_finished() -> bool:
        _, results = executions(stack.log("worker"))
        return sum(sum(decided) for decided in results.values()) >= 60

    assert wait_until(chunk_finished, timeout_s=30)
    received, results = executions(stack.log("worker"))
    print(
        f"\n[faults] rabbitmq visibility: task held {held_s:.0f}s "
        f"({held_s / OLD_VISIBILITY_TIMEOUT_S:.0f}x the old timeout), received "
        f"{sorted(received.values())}, runs decided per execution {dict(results)}"
    )
    assert received and set(received.values()) == {1}, received
    assert sum(len(done) for done in results.values()) == len(received)
    check_books(db, workload)


def queued(vhost) -> int:
    ready, _ = vhost.depth(TASK_QUEUE)
    return ready


@pytest.mark.parametrize("fault", ["connections-closed", "node-restart"])
def test_broker_restart_with_tasks_queued_loses_no_message_and_ingest_keeps_answering(
    fault, settings, db, make_key, private_redis, rabbit_vhost, stack
):
    """``connections-closed``: the broker closes every connection of the test's vhost, what
    its clients see of a restart (safe on a broker other sessions share).
    ``node-restart``: ``rabbitmqctl stop_app`` / ``start_app``, only where the broker is the
    tests' own (``FAIRMETER_TEST_RABBITMQ_RESTART=1``, set by ``.ci/run`` when it started it)."""
    if fault == "node-restart" and not RESTART_ALLOWED:
        pytest.skip("restarts the machine's shared RabbitMQ: set FAIRMETER_TEST_RABBITMQ_RESTART=1")
    first = Workload.make(300, 30, START, prefix="queued")
    during = Workload.make(200, 20, START, prefix="outage")
    env = stack.env(
        settings, private_redis.url(), rabbit_vhost.url(), FAIRMETER_SETTLE_CHUNK_SIZE="20"
    )
    api = stack.api(env)
    key = make_key()
    worker = stack.worker(env)
    stack.beat(env)
    # Both worker children block on the customers' settlement locks, so the other chunks
    # wait in the queue; then the broker drops every client, as a restart does: the
    # messages waiting and the two deliveries being worked on must all survive.
    with customers_locked(db.info.dsn, first.customers()):
        assert stack.ingest(api, key, first.batches(20)).start().join(60)
        assert wait_until(lambda: queued(rabbit_vhost) >= 5, timeout_s=30), "nothing queued"
        assert wait_until(
            lambda: len(children_in_transaction(worker, db, waiting_on_a_lock=True)) == 2,
            timeout_s=30,
        ), "the worker children never took a chunk"
        waiting = queued(rabbit_vhost)
        outage = stack.ingest(api, key, during.batches(10), phase="outage").start()
        if fault == "node-restart":
            restart_node()
        else:
            rabbit_vhost.close_all_connections()
        # Deliveries of the closed connections go back to the queue: nothing is lost.
        after_close = queued_once_answering(rabbit_vhost)
        readyz = httpx.get(f"{api}/readyz", timeout=10).status_code
        outage.phase = "after"
    assert outage.join(60), "ingest did not deliver every batch"
    assert set(outage.statuses()) == {200}, outage.statuses()
    assert wait_until(lambda: all_settled(db, 500), timeout_s=120), f"{settled_runs(db)}/500"
    reconnected = stack.log("worker").count("Connected to amqp://")
    print(
        f"\n[faults] rabbitmq {fault}: {waiting} messages waiting before, {after_close} "
        f"ready right after; worker connected {reconnected}x; readyz {readyz}; ingest "
        f"during the fault {outage.statuses('outage')}"
    )
    assert waiting >= 5 and after_close >= waiting
    assert reconnected >= 2, "the worker never reconnected"
    assert readyz == 200  # the API does not depend on the broker
    check_books(db, Workload({**first.kinds, **during.kinds}, first.events + during.events))


def queued_once_answering(vhost, timeout_s: float = 60) -> int:
    """The queue's ready messages, asked until the broker answers (a restarted node takes a
    moment to elect the quorum queue's leader)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return queued(vhost)
        except (OSError, amqp.exceptions.AMQPError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_poison_task_goes_to_the_dead_letter_queue_after_the_delivery_limit(
    settings, db, private_redis, rabbit_vhost, stack
):
    limit = 2
    env = stack.env(
        settings,
        private_redis.url(),
        rabbit_vhost.url(),
        FAIRMETER_BROKER_DELIVERY_LIMIT=str(limit),
    )
    stack.worker(env, include="tests.reliability.poison")
    update = {"broker_url": rabbit_vhost.url(), "broker_delivery_limit": limit}
    client = create_celery(settings.model_copy(update=update))
    try:
        poisoned = client.send_task(POISON_TASK).id
        assert wait_until(lambda: rabbit_vhost.depth(DEAD_LETTER_QUEUE)[0] == 1, timeout_s=90), (
            "the poison message never reached the dead-letter queue: "
            f"{rabbit_vhost.queues().get(DEAD_LETTER_QUEUE)}"
        )
        # The worker survived its poison and serves the queue as before.
        pong = client.send_task("fairmeter.ping").id
        assert wait_until(
            lambda: f"fairmeter.ping[{pong}] succeeded" in stack.log("worker"), timeout_s=60
        )
    finally:
        client.close()
    received = stack.log("worker").count(f"{POISON_TASK}[{poisoned}] received")
    dead = dead_letter_task_ids(rabbit_vhost)
    print(
        f"\n[faults] rabbitmq poison: delivered {received}x with delivery limit {limit}, then "
        f"dead-lettered"
    )
    assert dead == [poisoned]
    assert limit <= received <= limit + 1, received
    assert queued(rabbit_vhost) == 0


def dead_letter_task_ids(vhost) -> list[str]:
    """The task ids in the dead-letter queue (read, then left there)."""
    conn = amqp.Connection(
        HOST, userid=USER, password=PASSWORD, virtual_host=vhost.name, connect_timeout=5
    )
    conn.connect()
    ids = []
    try:
        channel = conn.channel()
        while (message := channel.basic_get(DEAD_LETTER_QUEUE)) is not None:
            ids.append(message.headers["id"])
    finally:
        conn.close()  # unacknowledged: the messages stay in the queue
    return ids
