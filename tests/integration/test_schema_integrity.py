"""The schema itself refuses rows that would put money or evidence on the wrong books.

The code never writes such rows; these keys are what stops a future bug (or a hand-made
fix in psql) from doing it: an event or ledger entry names a run of its own tenant, and a
ledger entry its run's own customer.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from tests.helpers.events import STRUCTURED, auth, usage


def _ingest(client: Any, key: str, **fields: Any) -> None:
    reply = client.post(
        "/v1/events", content=json.dumps(usage(**fields)), headers=auth(key, **STRUCTURED)
    )
    assert reply.status_code == 200, reply.text


def _run_id(db: psycopg.Connection[Any], tenant: str, subject: str) -> int:
    row = db.execute(
        "SELECT id FROM runs WHERE tenant_id = %s AND subject = %s", (tenant, subject)
    ).fetchone()
    assert row is not None
    return int(row[0])


INSERT_EVENT = """
INSERT INTO events (tenant_id, source, event_id, type, run_id, time, received_at,
                    body_hash, attributes, data)
VALUES (%s, 'psql', %s, 'run.delivered', %s, now(), now(), '\\x00', '{}', '{}')
"""

INSERT_POSTING = """
INSERT INTO ledger_entries (tenant_id, customer_id, run_id, kind, amount_micros,
                            decision_version)
VALUES (%s, %s, %s, 'post', 1, %s)
"""


@pytest.fixture
def two_tenants(client: Any, make_key: Any, db: psycopg.Connection[Any]) -> dict[str, int]:
    acme, globex = make_key(tenant="acme"), make_key(tenant="globex")
    _ingest(client, acme, run="run-a1", customer="cust-1")
    _ingest(client, acme, run="run-a2", customer="cust-2")
    _ingest(client, globex, run="run-g1", customer="cust-1")
    return {
        "a1": _run_id(db, "acme", "run-a1"),
        "a2": _run_id(db, "acme", "run-a2"),
        "g1": _run_id(db, "globex", "run-g1"),
    }


def test_an_event_must_name_a_run_of_its_own_tenant(db, two_tenants):
    db.execute(INSERT_EVENT, ("acme", "own-run", two_tenants["a1"]))  # the control
    with pytest.raises(psycopg.errors.ForeignKeyViolation, match="runs"):
        db.execute(INSERT_EVENT, ("globex", "other-tenants-run", two_tenants["a1"]))
    assert db.execute("SELECT count(*) FROM events WHERE source = 'psql'").fetchone() == (1,)


def test_a_ledger_entry_must_name_its_runs_tenant_and_customer(db, two_tenants):
    db.execute(INSERT_POSTING, ("acme", "cust-1", two_tenants["a1"], 97))  # the control
    with pytest.raises(psycopg.errors.ForeignKeyViolation, match="runs"):
        db.execute(INSERT_POSTING, ("acme", "cust-2", two_tenants["a1"], 98))  # another customer
    with pytest.raises(psycopg.errors.ForeignKeyViolation, match="runs"):
        db.execute(INSERT_POSTING, ("globex", "cust-1", two_tenants["a1"], 99))  # another tenant
    postings = db.execute("SELECT count(*) FROM ledger_entries WHERE kind = 'post'").fetchone()
    assert postings == (1,)
