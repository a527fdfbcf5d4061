"""Notifications are written with the change and announced only when it commits."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from metering.db import raw_transaction
from metering.notifications import CHANNEL, Notification, record, record_many


def _customer(db: psycopg.Connection[Any], tenant: str = "acme", customer: str = "c1") -> None:
    db.execute("INSERT INTO tenants (id) VALUES (%s) ON CONFLICT DO NOTHING", (tenant,))
    db.execute(
        "INSERT INTO customers (tenant_id, id) VALUES (%s, %s) ON CONFLICT DO NOTHING",
        (tenant, customer),
    )


def _listen(db: psycopg.Connection[Any]) -> list[list[Any]]:
    return [json.loads(n.payload) for n in db.notifies(timeout=1.0, stop_after=10)]


def test_rows_keep_the_order_given_and_are_announced_on_commit(
    engine: Any, db: psycopg.Connection[Any]
) -> None:
    _customer(db)
    db.execute(f"LISTEN {CHANNEL}")
    batch = [
        Notification("acme", "c1", "run.status_changed", {"status": str(i)}, subject="r1")
        for i in range(5)
    ]
    with raw_transaction(engine) as conn:
        ids = record_many(conn, batch)
    assert ids == sorted(ids)
    stored = db.execute("SELECT id, data->>'status' FROM notifications ORDER BY id").fetchall()
    assert [s for _, s in stored] == ["0", "1", "2", "3", "4"]
    assert [p[0] for p in _listen(db)] == ids


def test_a_rolled_back_change_tells_nobody(engine: Any, db: psycopg.Connection[Any]) -> None:
    _customer(db)
    db.execute(f"LISTEN {CHANNEL}")
    with pytest.raises(RuntimeError), raw_transaction(engine) as conn:
        record(conn, Notification("acme", "c1", "run.settled", subject="r1"))
        raise RuntimeError("the change failed")
    assert db.execute("SELECT count(*) FROM notifications").fetchone() == (0,)
    assert _listen(db) == []


def test_an_unknown_type_is_a_bug_caught_before_writing(engine: Any, db: Any) -> None:
    _customer(db)
    with pytest.raises(ValueError), raw_transaction(engine) as conn:
        record(conn, Notification("acme", "c1", "run.exploded"))
