"""Fan-out and claims on the real database: two workers at once double nothing and skip
nothing, a notification whose transaction commits late is still fanned out, a rolled-back
one is given up at the horizon, payloads are frozen, and claims keep each run's line."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from metering.db import raw_transaction
from metering.notifications import Notification, record
from metering.webhooks.delivery import claim
from metering.webhooks.fanout import fan_out, fan_out_pending
from tests.helpers.events import usage
from tests.helpers.ingest import ingest
from tests.helpers.webhooks import add_endpoint, customer, notify


def now() -> datetime:
    return datetime.now(UTC)


def cursor(db: Any) -> tuple[int, dict[str, float]]:
    row = db.execute("SELECT fanned_out_to, gaps FROM webhook_fanout").fetchone()
    return int(row[0]), dict(row[1])


def test_two_fan_outs_at_once_make_each_message_exactly_once(engine, settings, db):
    customer(engine)
    add_endpoint(engine, settings, "https://93.184.215.14/a")
    add_endpoint(engine, settings, "https://93.184.215.14/b")
    small = settings.model_copy(update={"webhooks_fanout_batch": 7})
    made: list[int] = []
    for i in range(150):
        notify(engine, "run.status_changed", step=i)
    barrier = threading.Barrier(2)

    def worker() -> None:
        barrier.wait()
        made.append(fan_out_pending(engine, small, now))

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sum(made) == 300
    pairs = db.execute(
        "SELECT count(*), count(DISTINCT (endpoint_id, notification_id)) FROM webhook_messages"
    ).fetchone()
    assert pairs == (300, 300)
    assert cursor(db) == (150, {})


def test_a_notification_committed_after_a_later_one_is_still_fanned_out(engine, settings, db):
    customer(engine)
    endpoint_id, _ = add_endpoint(engine, settings, "https://93.184.215.14/a")
    with raw_transaction(engine) as slow:  # takes id 1 now, commits last
        early = record(slow, Notification("acme", "cust-1", "run.status_changed", {"n": 1}))
        late = notify(engine, "run.status_changed", n=2)
        with raw_transaction(engine) as conn:
            assert fan_out(conn, settings, now()).created == 1
        assert cursor(db)[0] == late and str(early) in cursor(db)[1]
    with raw_transaction(engine) as conn:
        assert fan_out(conn, settings, now()).created == 1
    got = db.execute(
        "SELECT notification_id FROM webhook_messages WHERE endpoint_id = %s ORDER BY id",
        (endpoint_id,),
    ).fetchall()
    assert [g[0] for g in got] == [late, early]
    assert cursor(db) == (late, {})


def test_a_rolled_back_notification_is_given_up_at_the_horizon(engine, settings, db):
    customer(engine)
    add_endpoint(engine, settings, "https://93.184.215.14/a")
    quick = settings.model_copy(update={"webhooks_fanout_horizon_s": 1.0})
    try:
        with raw_transaction(engine) as doomed:
            record(doomed, Notification("acme", "cust-1", "run.status_changed"))
            raise RuntimeError("rolled back")
    except RuntimeError:
        pass
    notify(engine, "run.status_changed")
    with raw_transaction(engine) as conn:
        fan_out(conn, quick, now())
    assert list(cursor(db)[1]) == ["1"]
    time.sleep(1.1)
    with raw_transaction(engine) as conn:
        fan_out(conn, quick, now())
    assert cursor(db) == (2, {})


def test_the_payload_is_frozen_when_the_message_is_made(engine, settings, db, client, make_key):
    ingest(engine, settings, [usage(run="run-1", customer="cust-1", step=1)])
    add_endpoint(engine, settings, "https://93.184.215.14/a")
    notify(engine, "run.status_changed", run="run-1", status="Agent running")
    with raw_transaction(engine) as conn:
        fan_out(conn, settings, now())
    (before,) = db.execute("SELECT payload FROM webhook_messages").fetchone()
    shown = client.get("/v1/runs/run-1", headers={"authorization": f"Bearer {make_key()}"})
    assert json.loads(before)["data"]["run"] == shown.json()
    ingest(engine, settings, [usage(run="run-1", customer="cust-1", step=2)])
    with raw_transaction(engine) as conn:
        fan_out(conn, settings, now())
    (after,) = db.execute("SELECT payload FROM webhook_messages").fetchone()
    assert after == before
    assert json.loads(after)["data"]["status"] == "Agent running"


def test_concurrent_claims_split_the_work_and_take_one_message_per_run_line(engine, settings, db):
    runs = [f"run-{i}" for i in range(10)]
    ingest(engine, settings, [usage(run=r, customer="cust-1") for r in runs])
    add_endpoint(engine, settings, "https://93.184.215.14/a")
    for step in range(3):
        for r in runs:
            notify(engine, "run.status_changed", run=r, step=step)
    with raw_transaction(engine) as conn:
        fan_out(conn, settings, now())
    taken: list[list[Any]] = []
    barrier = threading.Barrier(4)

    def claimer() -> None:
        barrier.wait()
        with raw_transaction(engine) as conn:
            taken.append(claim(conn, now(), 100, timedelta(seconds=30)))

    threads = [threading.Thread(target=claimer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    ids = [m.id for batch in taken for m in batch]
    assert len(ids) == len(set(ids)) == len(runs)  # each run's head, once
    heads = db.execute(
        "SELECT DISTINCT ON (run_id) id FROM webhook_messages ORDER BY run_id, notification_id"
    ).fetchall()
    assert set(ids) == {h[0] for h in heads}
    with raw_transaction(engine) as conn:  # all leased: nothing more until they are done
        assert claim(conn, now(), 100, timedelta(seconds=30)) == []
