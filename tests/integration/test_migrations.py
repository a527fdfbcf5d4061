"""The models and the migrations agree, and the migrations run both ways."""

from __future__ import annotations

import os

import psycopg
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine

from metering.config import to_psycopg_url
from metering.history.partitions import is_partition_of_monthly_table
from metering.migrate import downgrade, upgrade
from metering.models import metadata
from tests.helpers.services import drop_database, recreate_database, server_database_url

SCRATCH = f"fairmeter_test_migrations_{os.getpid()}"


def _not_a_partition(obj: object, name: str | None, type_: str, *_: object) -> bool:
    return not (type_ == "table" and name is not None and is_partition_of_monthly_table(name))


def schema_diff(url: str) -> list[object]:
    engine = create_engine(to_psycopg_url(url))
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"include_object": _not_a_partition})
            return list(compare_metadata(context, metadata))
    finally:
        engine.dispose()


def tables(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
        ).fetchall()
    return {r[0] for r in rows} - {"alembic_version"}


def test_models_and_migrations_agree(database_url):
    assert schema_diff(database_url) == []


def test_downgrade_then_upgrade_round_trips():
    url = recreate_database(server_database_url(), SCRATCH)
    upgrade(url)
    built = tables(url)
    assert {"events", "runs", "usage_lines", "ledger_entries", "api_keys", "prices"} <= built
    downgrade(url, "base")
    assert tables(url) == set()
    try:
        upgrade(url)
        assert tables(url) == built
        assert schema_diff(url) == []
    finally:
        drop_database(server_database_url(), SCRATCH)


def test_ledger_refuses_updates_and_deletes(database_url, db, make_key, client):
    import json

    import pytest

    from tests.helpers.events import STRUCTURED, auth, usage

    reply = client.post(
        "/v1/events", content=json.dumps(usage()), headers=auth(make_key(), **STRUCTURED)
    )
    assert reply.status_code == 200, reply.text
    assert db.execute("SELECT count(*) FROM ledger_entries").fetchone() == (1,)
    for statement in (
        "UPDATE ledger_entries SET amount_micros = 0",
        "DELETE FROM ledger_entries",
        "UPDATE events SET data = '{}'",
        "DELETE FROM usage_lines",
    ):
        with pytest.raises(psycopg.errors.RestrictViolation, match="append-only"):
            db.execute(statement)


def test_decisions_made_before_policy_versions_get_version_0(settings):
    """0016 gives every existing decision policy_version 0 (the settings), without editing
    the append-only rows; 0017 leaves their cap inputs unknown (NULL)."""
    from datetime import UTC, datetime, timedelta

    from metering.db import create_db_engine
    from metering.prices import insert_prices
    from metering.settlement.runner import settle_due_now
    from tests.helpers.catalog import stable_prices
    from tests.helpers.events import event, usage
    from tests.helpers.ingest import ingest

    url = recreate_database(server_database_url(), SCRATCH)
    try:
        upgrade(url, "0015")
        with psycopg.connect(url) as conn:
            insert_prices(conn, stable_prices())
        start = datetime.now(UTC) - timedelta(hours=1)
        upgrade(url)
        scratch = settings.model_copy(update={"database_url": url})
        engine = create_db_engine(scratch)
        try:
            ingest(
                engine,
                scratch,
                [usage(step=1, time=start), event(type="run.completed", time=start)],
                tenant="old",
            )
            settle_due_now(engine, scratch, now=datetime.now(UTC))
        finally:
            engine.dispose()
        # Back to 0015: the decision stays, its new columns go, as before 0016 existed.
        # Forward again: the migrations must give it version 0 and unknown cap inputs.
        downgrade(url, "0015")
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT count(*) FROM decisions").fetchone() == (1,)
        upgrade(url)
        with psycopg.connect(url) as conn:
            row = conn.execute(
                "SELECT policy_version, period_gross_micros FROM decisions"
            ).fetchone()
        assert row == (0, None)
    finally:
        drop_database(server_database_url(), SCRATCH)
