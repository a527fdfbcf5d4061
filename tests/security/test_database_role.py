"""The database enforces what the application must never do, whoever asks.

The audit log and the ledger are append-only by trigger; the application's role is created by
``docs/deploy/init-app-role.sql`` exactly as a deployment does: no superuser, owner of nothing,
row privileges only. The API runs against that role, ingests, settles, credits and reads, and
that role cannot disable, drop or bypass the triggers, nor truncate anything.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg
import pytest

from tests.helpers import ROOT
from tests.helpers.events import BATCH, auth
from tests.helpers.scenarios import scenario
from tests.security.harness import serve

pytestmark = pytest.mark.timeout(120)

INIT_SQL = ROOT / "docs" / "deploy" / "init-app-role.sql"
APPEND_ONLY = (
    "ledger_entries",
    "decisions",
    "stripe_deliveries",
    "audit_log",
    "policy_versions",
    "policy_withdrawals",
)


def as_role(url: str, role: str, password: str) -> str:
    parts = urlsplit(url.replace("postgresql+psycopg://", "postgresql://", 1))
    host = parts.hostname or "127.0.0.1"
    netloc = f"{role}:{password}@{host}:{parts.port or 5432}"
    return urlunsplit(parts._replace(netloc=netloc))


@pytest.fixture
def app_role(settings, db) -> Iterator[tuple[str, str]]:
    """(role, DATABASE_URL as that role), made by the deployment script; dropped afterwards."""
    role = f"fairmeter_app_test_{uuid.uuid4().hex[:10]}"
    password = secrets.token_hex(12)
    owner = db.execute("SELECT current_user").fetchone()[0]  # who ran the migrations
    try:
        subprocess.run(
            [
                *("psql", settings.database_url, "-q", "-f", str(INIT_SQL)),
                *("-v", f"app_role={role}", "-v", f"owner_role={owner}"),
            ],
            env={**os.environ, "FAIRMETER_APP_DB_PASSWORD": password},
            check=True,
            capture_output=True,
            timeout=60,
        )
        yield role, as_role(settings.database_url, role, password)
    finally:
        db.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,)
        )
        db.execute(f'DROP OWNED BY "{role}"')  # its grants, here and on the database
        db.execute(f'DROP ROLE IF EXISTS "{role}"')


def refused(conn: psycopg.Connection[Any], sql: str) -> type[Exception] | None:
    """The error class PostgreSQL refused ``sql`` with, or None if it ran."""
    try:
        with conn.transaction():
            conn.execute(sql)
    except psycopg.Error as exc:
        return type(exc)
    return None


@pytest.mark.parametrize(
    "statement", ["UPDATE audit_log SET reason = 'x'", "DELETE FROM audit_log"]
)
def test_the_audit_log_is_append_only_even_for_its_owner(client, make_key, db, statement):
    key = make_key(scope="support")
    ingest = make_key(scope="ingest")
    events = scenario("completed", "run-a", "cust-1", datetime.now(UTC) - timedelta(hours=1))
    assert (
        client.post(
            "/v1/events", content=json.dumps(events), headers=auth(ingest, **BATCH)
        ).status_code
        == 200
    )
    opened = client.post(
        "/v1/support/runs/run-a/disputes",
        content=json.dumps({"claim": "it broke"}),
        headers=auth(key, **{"content-type": "application/json"}),
    )
    assert opened.status_code == 201, opened.text
    before = db.execute("SELECT count(*), max(reason) FROM audit_log").fetchone()
    assert before[0] == 1
    assert refused(db, statement) is psycopg.errors.RestrictViolation
    assert db.execute("SELECT count(*), max(reason) FROM audit_log").fetchone() == before


def test_the_app_role_is_no_superuser_and_owns_nothing(db, app_role):
    role, _ = app_role
    flags = db.execute(
        "SELECT rolsuper, rolcreaterole, rolcreatedb, rolreplication, rolbypassrls "
        "FROM pg_roles WHERE rolname = %s",
        (role,),
    ).fetchone()
    assert flags == (False, False, False, False, False)
    owned = db.execute(
        "SELECT count(*) FROM pg_class c JOIN pg_roles r ON r.oid = c.relowner "
        "WHERE r.rolname = %s",
        (role,),
    ).fetchone()[0]
    assert owned == 0
    for table in APPEND_ONLY:
        for privilege in ("TRUNCATE", "TRIGGER", "REFERENCES"):
            assert not db.execute(
                "SELECT has_table_privilege(%s, %s, %s)", (role, table, privilege)
            ).fetchone()[0], (table, privilege)
        assert db.execute("SELECT has_table_privilege(%s, %s, 'INSERT')", (role, table)).fetchone()[
            0
        ]


def test_the_app_role_makes_next_months_partitions_but_cannot_drop_one(db, app_role):
    """The beat connects as the app role; only an owner may add a partition, so the function
    that makes them runs as its owner. Dropping history still needs the owner."""
    _, url = app_role
    with psycopg.connect(url) as conn:
        made = conn.execute(
            "SELECT * FROM fairmeter_ensure_month_partitions('events', %s, %s)",
            (datetime(2061, 3, 1).date(), datetime(2061, 3, 1).date()),
        ).fetchall()
        assert made == [("events_y2061m03", "created")]
        assert refused(conn, "DROP TABLE events_y2061m03") is psycopg.errors.InsufficientPrivilege
        assert (
            refused(conn, "ALTER TABLE events DETACH PARTITION events_y2061m03")
            is psycopg.errors.InsufficientPrivilege
        )
        assert refused(conn, "CREATE TABLE mine (x int)") is psycopg.errors.InsufficientPrivilege
        conn.rollback()


def test_the_api_works_as_the_app_role_which_cannot_touch_the_ledgers_guards(
    settings, make_key, db, app_role, tmp_path
):
    role, url = app_role
    ingest, support = make_key(scope="ingest"), make_key(scope="support")
    customer = make_key(scope="customer", customer="cust-1")
    events = scenario("completed", "run-a", "cust-1", datetime.now(UTC) - timedelta(hours=1))
    with (
        serve(settings, tmp_path, DATABASE_URL=url) as api,
        httpx.Client(base_url=api.base, timeout=30) as http,
    ):
        sent = http.post("/v1/events", content=json.dumps(events), headers=auth(ingest, **BATCH))
        assert sent.status_code == 200, sent.text
        settled = http.post("/v1/support/runs/run-a/settle", headers=auth(support))
        assert settled.status_code == 200, settled.text
        assert settled.json()["billed_micros"] > 0
        credit = http.post(
            "/v1/support/runs/run-a/credit",
            content=json.dumps({"percent": "10", "reason": "goodwill"}),
            headers=auth(support, **{"content-type": "application/json"}),
        )
        assert credit.status_code == 200, credit.text
        assert http.get("/v1/runs/run-a", headers=auth(customer)).json()["credited_micros"] > 0
        statement = http.get("/v1/customers/cust-1/statements/current", headers=auth(customer))
        assert statement.status_code == 200 and statement.json()["lines"]
        assert http.get("/v1/support/audit", headers=auth(support)).json()
        assert "Traceback" not in api.logs(), api.logs()
    # Every row the API wrote, it wrote as the app role.
    assert db.execute("SELECT count(*) FROM ledger_entries").fetchone()[0] >= 3

    ledger = db.execute("SELECT md5(string_agg(t::text, '|' ORDER BY id)) FROM ledger_entries t")
    before = ledger.fetchone()[0]
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute("SELECT current_user").fetchone()[0] == role
        denied = psycopg.errors.InsufficientPrivilege
        for table in APPEND_ONLY:
            trigger = f"{table}_append_only"
            assert refused(conn, f"ALTER TABLE {table} DISABLE TRIGGER {trigger}") is denied
            assert refused(conn, f"ALTER TABLE {table} DISABLE TRIGGER ALL") is denied
            assert refused(conn, f"DROP TRIGGER {trigger} ON {table}") is denied
            assert refused(conn, f"TRUNCATE {table}") is denied
            assert refused(conn, f"ALTER TABLE {table} OWNER TO {role}") is denied
        assert refused(conn, "UPDATE ledger_entries SET amount_micros = 0") is (
            psycopg.errors.RestrictViolation
        )
        assert refused(conn, "DELETE FROM ledger_entries") is psycopg.errors.RestrictViolation
        assert refused(conn, "SET session_replication_role = replica") is denied
        assert refused(conn, "DROP FUNCTION fairmeter_refuse_edit() CASCADE") is denied
        assert refused(conn, "CREATE TABLE sneaky (id int)") is denied
        assert refused(conn, f"ALTER ROLE {role} SUPERUSER") is denied
    after = db.execute("SELECT md5(string_agg(t::text, '|' ORDER BY id)) FROM ledger_entries t")
    assert after.fetchone()[0] == before
    for table in APPEND_ONLY:
        enabled = db.execute(
            "SELECT tgenabled FROM pg_trigger WHERE tgname = %s", (f"{table}_append_only",)
        ).fetchone()
        assert enabled == ("O",), table
