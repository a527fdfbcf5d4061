"""Heavy requests get per-tenant bounds (issue #30 item 5, docs/reliability.md "Ingest next
to a tenant's heavy requests"): concurrent what-ifs and OTLP exports capped per tenant across
API processes, an OTLP export's spans bounded, statements bounded in time, and work
cancelled in PostgreSQL when its client is gone.

Every request here is real and served (two uvicorn workers). A request is made to stay in
PostgreSQL as long as a test needs by a lock the test holds (the what-if reads
``policy_versions`` first; an export takes its run's row lock), so nothing depends on how
fast the machine is.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
from google.rpc.status_pb2 import Status

from tests.api.heavy_harness import (
    PROMPT_S,
    Pending,
    abandoned,
    as_protobuf,
    chat_export,
    lock_waiters,
    locked,
)
from tests.helpers.processes import wait_until
from tests.security.harness import serve

JSON = "application/json"
PROTOBUF = "application/x-protobuf"
LOCK_POLICIES = "LOCK TABLE policy_versions IN ACCESS EXCLUSIVE MODE"
LOCK_RUN = "SELECT 1 FROM runs WHERE tenant_id = %s AND subject = %s FOR UPDATE"
# More events than a group commit takes (ingest_group_request_events): stored alone.
LARGE_EXPORT_SPANS = 120
PERIOD = {"period": "current", "document": {"rules": {"R4": False}}}


def post(base: str, path: str, key: str, body: bytes, kind: str = JSON) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}", "content-type": kind}
    return httpx.post(f"{base}{path}", headers=headers, content=body, timeout=PROMPT_S)


def what_if(base: str, key: str) -> httpx.Response:
    return post(base, "/v1/policy/what-if", key, json.dumps(PERIOD).encode())


def export(base: str, key: str, run: str, spans: int = LARGE_EXPORT_SPANS) -> httpx.Response:
    return post(base, "/v1/traces", key, chat_export(run, "cust-1", spans))


def waiting(db: Any, count: int) -> bool:
    return wait_until(lambda: lock_waiters(db) >= count, PROMPT_S)


def test_a_tenants_second_concurrent_what_if_is_refused_while_another_tenants_runs(
    heavy_api, make_key, db, settings
):
    acme, globex = make_key(tenant="acme", scope="admin"), make_key(tenant="globex", scope="admin")
    with locked(settings, LOCK_POLICIES):
        first = Pending(lambda: what_if(heavy_api.base, acme))
        assert waiting(db, 1), "the first what-if never reached the database"
        second = what_if(heavy_api.base, acme)
        assert second.status_code == 429, second.text
        assert second.json()["code"] == "too_many_concurrent_whatifs"
        assert int(second.headers["retry-after"]) >= 1
        other_tenant = Pending(lambda: what_if(heavy_api.base, globex))
        assert waiting(db, 2), "another tenant's what-if was held back by acme's"
    assert first.reply().status_code == 200
    assert other_tenant.reply().status_code == 200
    assert what_if(heavy_api.base, acme).status_code == 200  # the slot was given back


def test_a_tenants_third_concurrent_export_is_refused_as_a_google_rpc_status(
    heavy_api, make_key, db, settings
):
    acme, globex = make_key(tenant="acme"), make_key(tenant="globex")
    assert export(heavy_api.base, acme, "busy-run", spans=1).status_code == 200
    with locked(settings, LOCK_RUN, "acme", "busy-run"):
        both = [Pending(export, heavy_api.base, acme, "busy-run") for _ in range(2)]
        assert waiting(db, 2), "two exports never reached the run's lock"
        small = as_protobuf(chat_export("r3", "cust-1", 1))
        third = post(heavy_api.base, "/v1/traces", acme, small, PROTOBUF)
        assert third.status_code == 429, third.text
        assert third.headers["content-type"] == PROTOBUF
        assert Status.FromString(third.content).message.startswith("too_many_concurrent_exports")
        assert int(third.headers["retry-after"]) >= 1
        assert export(heavy_api.base, globex, "globex-run").status_code == 200
    assert [pending.reply().status_code for pending in both] == [200, 200]


def test_an_export_of_more_spans_than_the_bound_is_a_413_naming_it(heavy_api, make_key, db):
    key = make_key(tenant="acme")
    bound = 2048  # the default: four of the SDK batch processor's default batches (512)
    for spans, status in ((bound + 1, 413), (bound, 200)):
        body = chat_export("plain", "cust-1", spans, genai=False)
        reply = post(heavy_api.base, "/v1/traces", key, body)
        assert reply.status_code == status, reply.text
    assert reply.status_code == 200
    body = as_protobuf(chat_export("p", "c", bound + 1))
    refused = post(heavy_api.base, "/v1/traces", key, body, PROTOBUF)
    assert refused.status_code == 413
    assert f"at most {bound} spans" in Status.FromString(refused.content).message


def test_a_what_if_whose_client_disconnects_is_cancelled_in_postgresql(
    heavy_api, make_key, db, settings
):
    key = make_key(tenant="acme", scope="admin")
    with locked(settings, LOCK_POLICIES):
        with abandoned(
            heavy_api.base, "/v1/policy/what-if", key, json.dumps(PERIOD).encode(), JSON
        ):
            assert waiting(db, 1), "the what-if never reached the database"
        assert wait_until(lambda: lock_waiters(db) == 0, PROMPT_S), "still waiting for nobody"
    assert what_if(heavy_api.base, key).status_code == 200  # its slot and connection came back


def test_an_export_whose_exporter_disconnects_is_cancelled_in_postgresql(
    heavy_api, make_key, db, settings
):
    key = make_key(tenant="acme")
    assert export(heavy_api.base, key, "run-1", spans=1).status_code == 200
    with locked(settings, LOCK_RUN, "acme", "run-1"):
        body = chat_export("run-1", "cust-1", LARGE_EXPORT_SPANS)
        with abandoned(heavy_api.base, "/v1/traces", key, body, JSON):
            assert waiting(db, 1), "the export never reached the run's lock"
        assert wait_until(lambda: lock_waiters(db) == 0, PROMPT_S), "still waiting for nobody"
    assert export(heavy_api.base, key, "run-1").status_code == 200


def test_heavy_requests_out_of_time_are_retryable_503s_not_waits_for_minutes(
    make_key, db, settings, tmp_path
):
    """Two exports to one run take its lock in turn: the second waits at most
    ``heavy_lock_timeout_s``; a what-if runs at most ``whatif_timeout_s``."""
    admin, ingest = make_key(tenant="acme", scope="admin"), make_key(tenant="acme")
    with serve(
        settings,
        tmp_path,
        FAIRMETER_HEAVY_LOCK_TIMEOUT_S="2",
        FAIRMETER_WHATIF_TIMEOUT_S="1",
    ) as api:
        assert export(api.base, ingest, "run-1", spans=1).status_code == 200
        with locked(settings, LOCK_RUN, "acme", "run-1"):
            body = as_protobuf(chat_export("run-1", "cust-1", LARGE_EXPORT_SPANS))
            waited = post(api.base, "/v1/traces", ingest, body, PROTOBUF)
        assert waited.status_code == 503, waited.text
        assert Status.FromString(waited.content).message.startswith("lock_timeout")
        assert waited.headers["retry-after"] == "1"
        with locked(settings, LOCK_POLICIES):
            slow = what_if(api.base, admin)
        assert slow.status_code == 503, slow.text
        assert (slow.json()["code"], slow.headers["retry-after"]) == ("statement_timeout", "5")
        assert lock_waiters(db) == 0
