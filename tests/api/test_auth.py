"""Who may do what: no key 401, wrong scope 403, someone else's run 404."""

from __future__ import annotations

import json
import zlib
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from metering.keys import Scope, generate_key
from tests.helpers.events import STRUCTURED, auth, usage


def ingest(client: Any, key: str, body: Any) -> Any:
    return client.post("/v1/events", content=json.dumps(body), headers=auth(key, **STRUCTURED))


def read_run(client: Any, key: str | None, run: str = "run-1") -> Any:
    headers = auth(key) if key else {}
    return client.get(f"/v1/runs/{run}", headers=headers)


@pytest.fixture
def stored_run(client: Any, make_key: Any) -> str:
    """A run ``run-1`` of customer ``cust-1`` in tenant ``acme``; returns the ingest key."""
    key = make_key(tenant="acme", scope="ingest")
    assert ingest(client, key, usage(run="run-1", customer="cust-1")).status_code == 200
    return key


def test_no_key_is_401(client, stored_run):
    reply = read_run(client, None)
    assert reply.status_code == 401
    assert reply.json()["code"] == "unauthenticated"
    assert client.post("/v1/events", content="{}", headers=STRUCTURED).status_code == 401


@pytest.mark.parametrize(
    "bad_key",
    [
        "not-a-key",
        generate_key(Scope.INGEST).raw,  # well-formed, never issued
        generate_key(Scope.INGEST).raw[:-1] + "0",  # checksum broken
    ],
)
def test_unknown_or_malformed_key_is_401(client, stored_run, bad_key):
    assert read_run(client, bad_key).status_code == 401


def test_key_with_a_tampered_secret_is_401(client, stored_run):
    prefix, scope, key_id, secret, _ = stored_run.split("_")
    body = f"{prefix}_{scope}_{key_id}_{'0' * len(secret)}"
    forged = f"{body}_{zlib.crc32(body.encode()):08x}"[:-2]  # valid checksum, wrong secret
    assert read_run(client, forged).status_code == 401


@pytest.mark.parametrize("scope", ["support", "admin"])
def test_non_ingest_scopes_cannot_send_events(client, make_key, stored_run, scope):
    reply = ingest(client, make_key(scope=scope), usage())
    assert reply.status_code == 403
    assert reply.json()["code"] == "forbidden"


def test_customer_key_cannot_send_events(client, make_key, stored_run):
    key = make_key(scope="customer", customer="cust-1")
    assert ingest(client, key, usage()).status_code == 403


@pytest.mark.parametrize("scope", ["ingest", "support", "admin"])
def test_tenant_keys_read_their_tenants_runs(client, make_key, stored_run, scope):
    reply = read_run(client, make_key(scope=scope))
    assert reply.status_code == 200
    assert reply.json()["customer"] == "cust-1"


def test_customer_key_reads_its_own_customers_run(client, make_key, stored_run):
    assert read_run(client, make_key(scope="customer", customer="cust-1")).status_code == 200


def test_customer_key_of_another_customer_gets_404(client, make_key, stored_run):
    reply = read_run(client, make_key(scope="customer", customer="cust-2"))
    assert reply.status_code == 404
    assert reply.json()["code"] == "run_not_found"


@pytest.mark.parametrize("scope", ["ingest", "support", "admin"])
def test_another_tenants_key_gets_404(client, make_key, stored_run, scope):
    assert read_run(client, make_key(tenant="globex", scope=scope)).status_code == 404


def test_same_run_id_in_two_tenants_is_two_runs(client, make_key, stored_run):
    other = make_key(tenant="globex")
    assert ingest(client, other, usage(run="run-1", customer="someone-else")).status_code == 200
    assert read_run(client, other).json()["customer"] == "someone-else"
    assert read_run(client, stored_run).json()["customer"] == "cust-1"


def test_revoked_key_is_401(client, engine, stored_run):
    from metering.db import raw_transaction
    from metering.keys import parse_key
    from metering.keys_repo import revoke_key

    parsed = parse_key(stored_run)
    assert parsed is not None
    client.app.state.services.keys._found.clear()  # skip the TTL for the test
    with raw_transaction(engine) as conn:
        revoke_key(conn, parsed.key_id)
    assert read_run(client, stored_run).status_code == 401


def test_expired_key_is_401(client, engine, stored_run):
    from metering.db import raw_transaction
    from metering.keys_repo import create_key
    from tests.helpers.database import TEST_PEPPER

    with raw_transaction(engine) as conn:
        _, raw = create_key(
            conn,
            tenant_id="acme",
            scope=Scope.SUPPORT,
            pepper=TEST_PEPPER,
            expires_at=datetime.now(UTC) - timedelta(seconds=1),
        )
    reply = read_run(client, raw)
    assert reply.status_code == 401
    assert "expired" in reply.json()["detail"]


def test_keys_are_stored_only_as_hmac(db, make_key):
    raw = make_key()
    stored = db.execute("SELECT secret_hmac FROM api_keys").fetchall()
    assert len(stored) == 1
    assert raw.split("_")[3] not in stored[0][0]
    assert len(stored[0][0]) == 64
