"""Webhooks delivered by a real worker and beat to real receivers on loopback, each verifying
with ``standardwebhooks.Webhook(secret).verify`` from PyPI: signed payloads with the run as
the API shows it, retries through a receiver's 500s and outages, per-run order, the secret
rotation overlap, type filters and tenant isolation."""

from __future__ import annotations

import itertools
import json
import time
from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

import pytest

from metering.db import raw_transaction
from metering.keys import Principal, Scope
from metering.notifications import SCHEMA_VERSION
from metering.webhooks.endpoints import rotate_secret
from tests.helpers.events import auth, usage
from tests.helpers.ingest import ingest
from tests.helpers.webhooks import Receiver, add_endpoint, messages, notify, wait_for

pytestmark = pytest.mark.timeout(300)

# Loopback receivers; quick retries, many of them (a 30 % failure rate must not exhaust a
# message's schedule: 0.3 ** 13 per message), lasting about 9 s in all.
WORKER_ENV = {
    "FAIRMETER_WEBHOOKS_ALLOW_PRIVATE": "true",
    "FAIRMETER_WEBHOOKS_RETRY_SCHEDULE_S": "[0.2, 0.2, 0.5, 0.5, 1, 1, 1, 1, 1, 1, 1, 1]",
    "FAIRMETER_WEBHOOKS_TIMEOUT_S": "5",
}
RUN_STEPS = ["run.status_changed", "run.status_changed", "run.settled", "run.resettled"]


def runs(engine: Any, settings: Any, count: int, *, tenant: str = "acme") -> list[str]:
    names = [f"{tenant}-run-{i}" for i in range(count)]
    ingest(
        engine,
        settings,
        [usage(run=name, customer=f"{tenant}-cust") for name in names],
        tenant=tenant,
    )
    return names


def notify_steps(engine: Any, names: list[str], *, tenant: str = "acme") -> None:
    """Each run's steps in order, the runs interleaved, one transaction each."""
    for step, type_ in enumerate(RUN_STEPS):
        for name in names:
            notify(engine, type_, tenant=tenant, customer_id=f"{tenant}-cust", run=name, step=step)


def assert_per_run_order(receiver: Receiver, db: Any, endpoint_id: str) -> None:
    """Each run's messages were accepted in notification order, and no request for a run's
    next message arrived before the one before it was accepted."""
    by_run: dict[str, list[str]] = defaultdict(list)
    for msg_id, run, *_ in messages(db, endpoint_id):
        by_run[run].append(msg_id)
    for run, ids in by_run.items():
        for earlier, later in itertools.pairwise(ids):
            accepted = min(r.answered_seq for r in receiver.accepted() if r.msg_id == earlier)
            first_try = min(r.seq for r in receiver.received(later))
            assert accepted < first_try, f"{run}: {later} sent before {earlier} was delivered"


def test_a_settled_run_reaches_the_receiver_signed_with_the_run_as_the_api_shows_it(
    webhook_worker, engine, settings, db, client, make_key
):
    [run] = runs(engine, settings, 1)
    with Receiver() as receiver:
        _, secret = add_endpoint(engine, settings, receiver.url)
        receiver.secrets = [secret]
        notify(engine, "run.settled", customer_id="acme-cust", run=run, outcome="billed")
        wait_for(lambda: len(receiver.processed) == 1)
    [got] = receiver.accepted()
    assert got.verified
    [(msg_id, *_)] = messages(db)
    assert got.headers["webhook-id"] == msg_id
    assert got.headers["content-type"] == "application/json"
    payload = got.payload
    assert payload["type"] == "run.settled"
    assert payload["schema_version"] == SCHEMA_VERSION
    assert datetime.fromisoformat(payload["timestamp"]).tzinfo is not None
    assert payload["data"]["outcome"] == "billed"
    shown = client.get(f"/v1/runs/{run}", headers=auth(make_key(scope="admin")))
    assert payload["data"]["run"] == shown.json()
    stored = db.execute("SELECT payload, status FROM webhook_messages").fetchone()
    assert (got.body, stored[1]) == (stored[0].encode(), "delivered")
    attempt = db.execute(
        "SELECT attempt, outcome, status_code, latency_ms, response_excerpt FROM webhook_attempts"
    ).fetchone()
    assert attempt[:3] == (1, "delivered", 200)
    assert attempt[3] >= 0 and json.loads(attempt[4]) == {"ok": True}


def test_a_receiver_failing_30_percent_gets_everything_once_and_in_order_per_run(
    webhook_worker, engine, settings, db
):
    names = runs(engine, settings, 12)
    with Receiver(fail_rate=0.3, seed=1616) as receiver:
        endpoint_id, secret = add_endpoint(engine, settings, receiver.url)
        receiver.secrets = [secret]
        notify_steps(engine, names)
        wait_for(lambda: len(messages(db, endpoint_id)) == len(names) * len(RUN_STEPS))
        expected = {m[0] for m in messages(db, endpoint_id)}
        wait_for(lambda: set(receiver.processed) == expected, 180)
    assert sum(r.status == 500 for r in receiver.requests) > 5  # the retries were real
    assert all(r.verified for r in receiver.requests)
    assert len(receiver.accepted()) == len(expected)  # none delivered twice
    for msg_id in expected:
        assert len({r.body for r in receiver.received(msg_id)}) == 1  # byte-identical retries
    assert_per_run_order(receiver, db, endpoint_id)
    statuses = db.execute("SELECT DISTINCT status FROM webhook_messages").fetchall()
    assert statuses == [("delivered",)]


def test_a_receiver_that_was_down_gets_everything_once_it_is_back(
    webhook_worker, engine, settings, db
):
    names = runs(engine, settings, 3)
    receiver = Receiver()
    endpoint_id, secret = add_endpoint(engine, settings, receiver.url)
    receiver.secrets = [secret]
    notify_steps(engine, names)  # nobody listening
    failed = "SELECT count(*) FROM webhook_attempts WHERE status_code IS NULL AND error > ''"
    wait_for(lambda: db.execute(failed).fetchone()[0] >= 3)
    with receiver:
        wait_for(lambda: len(messages(db, endpoint_id)) == len(names) * len(RUN_STEPS))
        expected = {m[0] for m in messages(db, endpoint_id)}
        wait_for(lambda: set(receiver.processed) == expected, 120)
    assert len(receiver.accepted()) == len(expected)
    assert_per_run_order(receiver, db, endpoint_id)
    refused = db.execute("SELECT error FROM webhook_attempts WHERE error IS NOT NULL").fetchone()
    assert "ConnectError" in refused[0]


def test_one_tenants_endpoint_never_receives_another_tenants_notifications(
    webhook_worker, engine, settings, db
):
    acme, globex = runs(engine, settings, 3), runs(engine, settings, 3, tenant="globex")
    with Receiver() as a, Receiver() as b:
        _, a_secret = add_endpoint(engine, settings, a.url)
        _, b_secret = add_endpoint(engine, settings, b.url, tenant="globex")
        a.secrets, b.secrets = [a_secret], [b_secret]
        for x, y in zip(acme, globex, strict=True):
            notify(engine, "run.settled", customer_id="acme-cust", run=x)
            notify(engine, "run.settled", tenant="globex", customer_id="globex-cust", run=y)
        wait_for(lambda: len(a.processed) == 3 and len(b.processed) == 3)
        time.sleep(2)  # anything misrouted would have arrived by now
    assert {r.payload["data"]["run"]["run"] for r in a.requests} == set(acme)
    assert {r.payload["data"]["run"]["run"] for r in b.requests} == set(globex)
    assert {r.payload["data"]["run"]["customer"] for r in a.requests} == {"acme-cust"}
    assert all(r.verified for r in [*a.requests, *b.requests])  # each signed with its own


def test_an_endpoint_gets_only_the_types_it_asked_for(webhook_worker, engine, settings, db):
    [run] = runs(engine, settings, 1)
    with Receiver() as receiver:
        endpoint_id, secret = add_endpoint(engine, settings, receiver.url, types=("run.settled",))
        receiver.secrets = [secret]
        for type_ in ("run.status_changed", "run.settled", "run.held"):
            notify(engine, type_, customer_id="acme-cust", run=run)
        wait_for(lambda: len(receiver.processed) == 1)
        time.sleep(2)
    assert [r.payload["type"] for r in receiver.requests] == ["run.settled"]
    assert len(messages(db, endpoint_id)) == 1


def test_after_a_rotation_receivers_with_either_secret_verify(webhook_worker, engine, settings, db):
    [run] = runs(engine, settings, 1)
    with Receiver() as receiver:
        endpoint_id, old = add_endpoint(engine, settings, receiver.url)
        with raw_transaction(engine) as conn:
            _, new = rotate_secret(
                conn,
                Principal("acme", Scope.ADMIN, "test"),
                endpoint_id,
                settings,
                datetime.now(UTC),
            )
        receiver.secrets = [old]  # a receiver not yet redeployed
        notify(engine, "run.settled", customer_id="acme-cust", run=run)
        wait_for(lambda: len(receiver.processed) == 1)
        receiver.secrets = [new]  # and one that already was
        notify(engine, "run.resettled", customer_id="acme-cust", run=run)
        wait_for(lambda: len(receiver.processed) == 2)
    assert all(r.verified for r in receiver.requests)
    assert all(len(r.headers["webhook-signature"].split(" ")) == 2 for r in receiver.requests)
