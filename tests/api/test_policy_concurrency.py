"""Concurrent policy writes serialise cleanly (issue #30, item 8): against the served API, each
gets the next version, or a retryable 409 — never a 422 about ``effective_from`` it never sent.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from typing import Any

import httpx
import psycopg

from tests.helpers.events import auth
from tests.security.harness import client_with

WRITERS = 20
WRITES_EACH = 2
# One patience for every wait here: a reply on a loaded 2-core host, and retries of a 409.
PATIENCE_S = 60.0


def write_until_stored(base: str, key: str, cap_runs: int, replies: list[Any]) -> None:
    """POST a version as a client would: a retryable 409 is retried after its Retry-After."""
    deadline = time.monotonic() + PATIENCE_S
    while True:
        reply = httpx.post(
            f"{base}/v1/policies",
            json={"document": {"cap_runs": cap_runs}},
            headers=auth(key),
            timeout=PATIENCE_S,
        )
        replies.append(reply)
        retryable = reply.status_code == 409 and "retry-after" in reply.headers
        if not retryable or time.monotonic() > deadline:
            return
        time.sleep(float(reply.headers["retry-after"]))


def test_concurrent_writes_each_get_the_next_version(live_server, make_key):
    tenant = f"pol-{uuid.uuid4().hex[:12]}"  # versions are append-only: a tenant of its own
    key = make_key(tenant=tenant, scope="admin")
    replies: list[Any] = []
    start = threading.Barrier(WRITERS)

    def writer(index: int) -> None:
        start.wait()
        for n in range(WRITES_EACH):
            write_until_stored(live_server, key, index * WRITES_EACH + n, replies)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(WRITERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(PATIENCE_S * 2)
    unexpected = [
        (r.status_code, r.text)
        for r in replies
        if r.status_code != 201
        and not (r.status_code == 409 and r.json()["code"] == "policy_write_conflict")
    ]
    assert not unexpected, unexpected
    stored = sorted(r.json()["version"] for r in replies if r.status_code == 201)
    assert stored == list(range(1, WRITERS * WRITES_EACH + 1))  # each once, no gaps
    listed = httpx.get(f"{live_server}/v1/policies", headers=auth(key), timeout=PATIENCE_S)
    versions = listed.json()
    assert [v["version"] for v in versions] == list(range(WRITERS * WRITES_EACH + 1))
    starts = [v["effective_from"] for v in versions[1:]]
    assert starts == sorted(starts)  # numbers and effect in one order
    assert sorted(v["document"]["cap_runs"] for v in versions[1:]) == list(
        range(WRITERS * WRITES_EACH)
    )


def test_a_writer_queued_too_long_gets_a_retryable_409(settings, make_key, db):
    """Another write holding the tenant's policy lock past the wait: 409 with Retry-After,
    nothing written; once the lock is free the same request is stored."""
    tenant = f"pol-{uuid.uuid4().hex[:12]}"
    key = make_key(tenant=tenant, scope="admin")
    body = json.dumps({"document": {"cap_runs": 3}})
    headers = auth(key, **{"content-type": "application/json"})
    with (
        client_with(settings, policy_write_wait_s=0.2) as client,
        psycopg.connect(db.info.dsn) as holder,
    ):
        holder.execute(
            "SELECT pg_advisory_xact_lock(hashtext('policy_versions:' || %s))", (tenant,)
        )
        refused = client.post("/v1/policies", content=body, headers=headers)
        assert refused.status_code == 409, refused.text
        assert refused.json()["code"] == "policy_write_conflict"
        assert refused.headers["retry-after"] == "1"
        holder.rollback()
        stored = client.post("/v1/policies", content=body, headers=headers)
        assert (stored.status_code, stored.json()["version"]) == (201, 1), stored.text
