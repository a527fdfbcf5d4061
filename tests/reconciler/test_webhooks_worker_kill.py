"""A worker SIGKILLed in the middle of a delivery loses nothing: its lease runs out, another
worker sends the message again with the same webhook-id and the same bytes."""

from __future__ import annotations

import os
import signal

import pytest
import redis

from tests.helpers.celery_worker import start_celery, stop_celery, worker_env
from tests.helpers.events import usage
from tests.helpers.ingest import ingest
from tests.helpers.webhooks import Receiver, add_endpoint, messages, notify, wait_for

pytestmark = pytest.mark.timeout(300)

LEASE_S = 3


def test_a_delivery_cut_by_sigkill_is_sent_again_under_the_same_webhook_id(
    settings, engine, db, tmp_path
):
    env = worker_env(
        settings,
        FAIRMETER_WEBHOOKS_ALLOW_PRIVATE="true",
        FAIRMETER_WEBHOOKS_LEASE_S=str(LEASE_S),
        FAIRMETER_WEBHOOKS_TIMEOUT_S="60",  # the hung request outlives the worker
    )
    redis.Redis.from_url(env["REDIS_URL"]).flushdb()

    def worker(name: str) -> object:
        return start_celery(
            ["worker", "--concurrency", "1", "--hostname", f"{name}-{os.getpid()}@%h"],
            env,
            tmp_path / f"{name}.log",
        )

    beat = start_celery(
        ["beat", "--schedule", str(tmp_path / "beat-schedule")], env, tmp_path / "beat.log"
    )
    first = worker("doomed")
    second = None
    ingest(engine, settings, [usage(run="run-1", customer="cust-1")])
    try:
        with Receiver() as receiver:
            _, secret = add_endpoint(engine, settings, receiver.url)
            receiver.secrets = [secret]
            receiver.hang.set()
            notify(engine, "run.settled", run="run-1")
            assert receiver.hung.wait(120), "the delivery never arrived"
            os.killpg(first.pid, signal.SIGKILL)  # type: ignore[attr-defined]
            first.wait(timeout=30)  # type: ignore[attr-defined]
            receiver.hang.clear()
            [(msg_id, _, _, status, attempts)] = messages(db)
            assert (status, attempts) == ("pending", 1)
            assert db.execute("SELECT count(*) FROM webhook_attempts").fetchone()[0] == 0

            second = worker("survivor")
            wait_for(lambda: messages(db)[0][3] == "delivered", 120)
            again = receiver.received(msg_id)[-1]
    finally:
        for proc in (second, first, beat):
            if proc is not None:
                stop_celery(proc)  # type: ignore[arg-type]
    sent = receiver.received(msg_id)
    assert len(sent) == 2 and {r.msg_id for r in sent} == {msg_id}
    assert sent[0].body == again.body  # byte-identical
    assert all(r.verified for r in sent)
    assert receiver.processed == [msg_id]  # the receiver acted once
    rows = db.execute("SELECT attempt, outcome FROM webhook_attempts").fetchall()
    assert rows == [(2, "delivered")]  # the killed attempt left no record, only its number
