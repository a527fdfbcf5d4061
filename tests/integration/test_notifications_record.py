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


def test_a_large_batch_is_stored_and_announced_in_order_as_one_statement(
    engine: Any, db: psycopg.Connection[Any]
) -> None:
    _customer(db)
    _customer(db, "acme", "c2")
    db.execute(f"LISTEN {CHANNEL}")
    batch = [
        Notification("acme", f"c{1 + i % 2}", "run.status_changed", {"i": i}, subject=f"r{i % 7}")
        for i in range(300)
    ] + [Notification("acme", "c1", "statement.closed", {"period": "2026-11"})]
    with raw_transaction(engine) as conn:
        ids = record_many(conn, batch)
    assert ids == sorted(ids) and len(set(ids)) == 301
    stored = db.execute("SELECT id, customer_id, subject, data FROM notifications ORDER BY id")
    assert [(c, s, d) for _, c, s, d in stored] == [
        (n.customer_id, n.subject, n.data) for n in batch
    ]
    told = [json.loads(n.payload) for n in db.notifies(timeout=2.0, stop_after=301)]
    assert told == [[i, "acme", n.customer_id, n.subject] for i, n in zip(ids, batch, strict=True)]
