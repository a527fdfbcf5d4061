"""Webhooks go out on kicks, not beat ticks: a worker with no beat at all delivers a run's
webhooks after the one sweep that settles it (settlement kicks the fan-out, the fan-out
kicks delivery), and again for a run settled after that round ended. Kicks are sent one at
a time: a second kick while one waits sends nothing, one after the task started does."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from celery import Celery

from reconciler.kicks import kick_once, started
from tests.helpers.celery_worker import start_celery, stop_celery, worker_env
from tests.helpers.ingest import ingest
from tests.helpers.scenarios import scenario
from tests.helpers.webhooks import Receiver, add_endpoint, wait_for

pytestmark = pytest.mark.timeout(300)

START = datetime.now(UTC) - timedelta(minutes=30)


def test_a_kick_is_sent_only_when_none_waits(settings):
    client = redis.Redis.from_url(settings.redis_url)
    name = f"test.kick.{uuid.uuid4().hex}"
    sent: list[float] = []
    assert kick_once(client, name, sent.append)
    assert not kick_once(client, name, sent.append)  # the first still waits
    started(client, name)
    assert kick_once(client, name, sent.append)  # a commit made while the task runs
    assert len(sent) == 2 and all(0 < expires <= 60 for expires in sent)
    assert 0 < client.ttl("fairmeter:kick:" + name) <= 60  # a lost kick's flag goes away
    client.delete("fairmeter:kick:" + name)
    client.close()


@pytest.fixture(scope="module")
def worker_without_beat(settings: Any, tmp_path_factory: Any) -> Iterator[dict[str, str]]:
    env = worker_env(settings, FAIRMETER_WEBHOOKS_ALLOW_PRIVATE="true")
    redis.Redis.from_url(env["REDIS_URL"]).flushdb()
    logs = tmp_path_factory.mktemp("kicks")
    args = ["worker", "--concurrency", "2", "--loglevel", "INFO"]
    worker = start_celery([*args, "--hostname", f"kicks-{os.getpid()}@%h"], env, logs / "w.log")
    try:
        yield env
    finally:
        stop_celery(worker)


def sweep_once(env: dict[str, str]) -> None:
    """What one beat tick of ``sweep-due-runs`` would send; nothing else is ever sent."""
    client = Celery(broker=env["REDIS_URL"])
    client.send_task("fairmeter.sweep_due_runs")
    client.close()


def test_a_worker_without_beat_delivers_after_the_settlement_kick(
    worker_without_beat, engine, settings, db
):
    with Receiver() as receiver:
        _, secret = add_endpoint(engine, settings, receiver.url, types=("run.settled",))
        receiver.secrets = [secret]
        for n, run in enumerate(["run-first", "run-after"], start=1):
            ingest(engine, settings, scenario("completed", run, "cust-1", START))
            time.sleep(1.2)  # the settle grace (1 s) has passed: the run is due
            sweep_once(worker_without_beat)
            wait_for(lambda n=n: len(receiver.processed) == n, 30)
        settled = [r.payload["data"]["run"]["run"] for r in receiver.accepted()]
    assert settled == ["run-first", "run-after"]
