"""Every key includes the tenant, so the schema can be distributed by tenant (issue #18).

Read from ``pg_catalog`` of the migrated database, not from the models: whatever a later
migration adds, each table's primary key, each unique constraint or unique index, and both
sides of each foreign key must name the table's tenant column, unless the table is on the
allow-list below, with its reason. docs/scaling.md says what this buys (Citus
``create_distributed_table(..., 'tenant_id')``) and what the allow-listed tables become.
"""

from __future__ import annotations

from typing import Any

import psycopg

# Tables that are not one tenant's data, and why. A new entry is a decision: say why the
# table can be the same on every shard (a reference table) or needs no tenant at all.
ALLOW_LIST = {
    "alembic_version": "Alembic's own bookkeeping: one row, the schema version",
    "prices": "catalog: model prices for every tenant; a small reference table",
    "provider_costs": "catalog: what each model costs the platform; a small reference table",
    "webhook_fanout": (
        "one cursor row per fan-out stream over all tenants' notifications: coordination "
        "state of the sweep, not tenant data"
    ),
    "stripe_webhook_inbox": (
        "Stripe's events to the platform's own account, keyed by Stripe's event id; the "
        "tenant is not known when one is received"
    ),
    "stripe_invoices": (
        "mirror of the platform Stripe account's invoices, keyed by Stripe's invoice id and "
        "written from Stripe's webhooks, which name a Stripe customer, not a tenant"
    ),
    "archived_months": (
        "the archive's bookkeeping: one row per monthly table and month, whose partition held "
        "every tenant's rows of that month; coordination state, not one tenant's data"
    ),
    "stripe_closed_periods": (
        "mirror of the platform Stripe account's finalized invoice periods, keyed by "
        "Stripe's invoice id (as stripe_invoices)"
    ),
}

# The tenant column of each table: ``tenant_id``, except in ``tenants`` itself.
TENANT_COLUMN = {"tenants": "id"}

TABLES = """
SELECT c.oid, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND NOT c.relispartition
ORDER BY c.relname
"""
# Primary keys and unique constraints are unique indexes too: one query covers all three.
UNIQUE_INDEXES = """
SELECT i.indrelid, ix.relname, i.indisprimary,
       array(SELECT a.attname FROM unnest(i.indkey) WITH ORDINALITY AS k(n, o)
             JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.n ORDER BY k.o)
FROM pg_index i JOIN pg_class ix ON ix.oid = i.indexrelid
WHERE i.indisunique AND i.indrelid = ANY(%s)
"""
FOREIGN_KEYS = """
SELECT f.conrelid, f.conname, f.confrelid,
       array(SELECT a.attname FROM unnest(f.conkey) WITH ORDINALITY AS k(n, o)
             JOIN pg_attribute a ON a.attrelid = f.conrelid AND a.attnum = k.n ORDER BY k.o),
       array(SELECT a.attname FROM unnest(f.confkey) WITH ORDINALITY AS k(n, o)
             JOIN pg_attribute a ON a.attrelid = f.confrelid AND a.attnum = k.n ORDER BY k.o)
FROM pg_constraint f WHERE f.contype = 'f' AND f.conrelid = ANY(%s)
"""


def tenant_key_violations(conn: psycopg.Connection[Any]) -> list[str]:
    """What breaks the rule in the database behind ``conn``, one line each; empty if none."""
    names = dict(conn.execute(TABLES).fetchall())
    keyed = {oid: name for oid, name in names.items() if name not in ALLOW_LIST}
    tenant = {oid: TENANT_COLUMN.get(name, "tenant_id") for oid, name in names.items()}
    problems = []
    columns = {
        (relid, name)
        for relid, name in conn.execute(
            "SELECT attrelid, attname FROM pg_attribute WHERE attrelid = ANY(%s) "
            "AND attnum > 0 AND NOT attisdropped",
            (list(keyed),),
        ).fetchall()
    }
    with_primary_key = set()
    for relid, index, primary, cols in conn.execute(UNIQUE_INDEXES, (list(keyed),)):
        with_primary_key.update([relid] if primary else [])
        if tenant[relid] not in cols:
            kind = "primary key" if primary else "unique index"
            problems.append(f"{keyed[relid]}: {kind} {index} {tuple(cols)} lacks {tenant[relid]}")
    for relid, name in keyed.items():
        if (relid, tenant[relid]) not in columns:
            problems.append(f"{name}: no {tenant[relid]} column")
        if relid not in with_primary_key:
            problems.append(f"{name}: no primary key")
    for relid, fk, parent, cols, parent_cols in conn.execute(FOREIGN_KEYS, (list(keyed),)):
        parent_tenant = tenant.get(parent, "tenant_id")
        if tenant[relid] not in cols or parent_tenant not in parent_cols:
            problems.append(
                f"{keyed[relid]}: foreign key {fk} {tuple(cols)} -> "
                f"{names.get(parent, parent)}{tuple(parent_cols)} lacks the tenant on a side"
            )
    return sorted(problems)


def test_every_key_of_a_tenant_table_includes_the_tenant(database_url):
    with psycopg.connect(database_url) as conn:
        assert tenant_key_violations(conn) == []


def test_the_allow_list_names_only_tables_that_exist(database_url):
    """A stale entry would let a new table of the same name skip the rule unnoticed."""
    with psycopg.connect(database_url) as conn:
        tables = {name for _, name in conn.execute(TABLES).fetchall()}
    assert set(ALLOW_LIST) <= tables
    assert set(TENANT_COLUMN) <= tables


def test_a_key_without_the_tenant_is_caught(database_url):
    """The check itself: a table keyed by id alone, and one whose foreign key skips the
    tenant, are both reported (in a transaction rolled back, so nothing stays)."""
    with psycopg.connect(database_url) as conn:
        conn.execute("CREATE TABLE later_table (id bigint PRIMARY KEY, tenant_id varchar(64))")
        conn.execute(
            "CREATE TABLE later_child (tenant_id varchar(64), id bigint, "
            "parent_id bigint REFERENCES later_table (id), PRIMARY KEY (tenant_id, id))"
        )
        found = [line for line in tenant_key_violations(conn) if line.startswith("later_")]
        conn.rollback()
    assert found == [
        "later_child: foreign key later_child_parent_id_fkey ('parent_id',) -> "
        "later_table('id',) lacks the tenant on a side",
        "later_table: primary key later_table_pkey ('id',) lacks tenant_id",
    ]


def test_the_models_primary_keys_are_the_databases(database_url):
    """Alembic's comparison (test_migrations.py) does not look at primary keys: this does,
    column order included, so a model cannot drift back to a key without the tenant."""
    from metering.models import metadata

    with psycopg.connect(database_url) as conn:
        stored = dict(conn.execute(PRIMARY_KEYS).fetchall())
    declared = {t.name: [c.name for c in t.primary_key.columns] for t in metadata.sorted_tables}
    assert declared == {name: stored[name] for name in declared}


PRIMARY_KEYS = """
SELECT c.relname,
       array(SELECT a.attname FROM unnest(i.indkey) WITH ORDINALITY AS k(n, o)
             JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.n ORDER BY k.o)
FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE i.indisprimary AND n.nspname = 'public'
"""

# Rows of one tenant as 0020 stored them: the three child tables without a tenant_id yet.
ROWS_BEFORE_0021 = """
INSERT INTO tenants (id) VALUES ('old');
INSERT INTO customers (tenant_id, id) VALUES ('old', 'c1');
INSERT INTO runs (id, tenant_id, subject, customer_id, first_event_at, last_event_at,
                  last_received_at, event_count)
VALUES (7, 'old', 'run-7', 'c1', now(), now(), now(), 1);
INSERT INTO events (id, tenant_id, source, event_id, type, run_id, time, received_at,
                    body_hash, attributes, data)
VALUES (11, 'old', 'agent', 'e1', 'run.usage', 7, now(), now(), '\\x00', '{}', '{}');
INSERT INTO usage_lines (id, event_pk, run_id, model, step, attempt, replay, input_tokens,
                         cached_input_tokens, output_tokens, input_micros, cached_input_micros,
                         output_micros, gross_micros, time)
VALUES (13, 11, 7, 'm', 1, 1, false, 1, 0, 0, 5, 0, 0, 5, now());
INSERT INTO api_keys (key_id, tenant_id, scope, secret_hmac) VALUES ('k1', 'old', 'admin', 'x');
INSERT INTO console_sessions (token_sha256, key_id, expires_at) VALUES ('t1', 'k1', now());
INSERT INTO notifications (id, tenant_id, customer_id, run_id, type, data)
VALUES (17, 'old', 'c1', 7, 'run.settled', '{}');
INSERT INTO webhook_endpoints (id, tenant_id, url, enabled, secret_seed)
VALUES ('ep1', 'old', 'https://example.test/hook', true, 's');
INSERT INTO webhook_messages (id, msg_id, tenant_id, endpoint_id, notification_id, type,
                              payload, status)
VALUES (19, 'msg1', 'old', 'ep1', 17, 'run.settled', '{}', 'delivered');
INSERT INTO webhook_attempts (message_id, attempt, outcome, started_at, latency_ms)
VALUES (19, 1, 'delivered', now(), 3);
"""


def test_0021_gives_existing_child_rows_their_parents_tenant_and_downgrades():
    """Usage lines, console sessions and webhook attempts stored before 0021 get the tenant
    of their run, key and message; going back to 0020 keeps every row."""
    import os

    from metering.migrate import downgrade, upgrade
    from tests.helpers.services import drop_database, recreate_database, server_database_url

    url = recreate_database(server_database_url(), f"fairmeter_test_tenant_keys_{os.getpid()}")
    try:
        upgrade(url, "0020")
        with psycopg.connect(url) as conn:
            conn.execute(ROWS_BEFORE_0021)
        upgrade(url, "0021")
        with psycopg.connect(url) as conn:
            tenants = [
                conn.execute(f"SELECT tenant_id FROM {table}").fetchall()
                for table in ("usage_lines", "console_sessions", "webhook_attempts")
            ]
            assert tenants == [[("old",)]] * 3
            assert tenant_key_violations(conn) == []
        downgrade(url, "0020")
        with psycopg.connect(url) as conn:
            counts = [
                conn.execute(f"SELECT count(*) FROM {table}").fetchone()
                for table in ("usage_lines", "console_sessions", "webhook_attempts")
            ]
        assert counts == [(1,)] * 3
    finally:
        drop_database(server_database_url(), f"fairmeter_test_tenant_keys_{os.getpid()}")


# Plain (not unique, not partial) indexes whose columns lead another index of their table:
# the longer index serves every lookup the shorter one does, so the shorter is pure cost.
REDUNDANT_INDEXES = """
WITH ix AS (
    SELECT i.indrelid::regclass::text AS tbl, c.relname AS name, i.indisunique AS uniq,
           i.indpred IS NOT NULL AS partial, (i.indkey::int2[])[0:] AS cols
    FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
    JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = 'public'
)
SELECT a.tbl, a.name, b.name FROM ix a JOIN ix b ON a.tbl = b.tbl AND a.name <> b.name
WHERE NOT a.uniq AND NOT a.partial AND NOT b.partial
  AND cardinality(a.cols) <= cardinality(b.cols) AND b.cols[1:cardinality(a.cols)] = a.cols
ORDER BY 1, 2, 3
"""


def test_no_index_is_made_redundant_by_another(database_url):
    """Re-keying added ``tenant_id`` to many keys; a key that led with it would have made an
    index on ``tenant_id`` alone (as ``api_keys`` has) a duplicate. None is, nor any other."""
    with psycopg.connect(database_url) as conn:
        assert conn.execute(REDUNDANT_INDEXES).fetchall() == []
