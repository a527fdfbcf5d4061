"""The sweep's claim and a worker's hold on the runs it settles (issue #13 §7)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from metering.db import raw_transaction
from metering.settlement import repo
from metering.settlement.runner import claim_due_chunks, settle_chunk
from tests.helpers.events import event, usage
from tests.helpers.ingest import ingest


def completed_run(engine: Any, settings: Any, db: Any, ended: datetime) -> int:
    ingest(
        engine,
        settings,
        [usage(step=1, time=ended - timedelta(minutes=1)), event(type="run.completed", time=ended)],
    )
    return int(db.execute("SELECT id FROM runs").fetchone()[0])


def claimed_until(db: Any) -> datetime:
    value: datetime = db.execute("SELECT claimed_until FROM runs").fetchone()[0]
    return value


def test_started_chunk_holds_its_runs_on_the_short_lease_and_renews_it(engine, settings, db):
    now = datetime.now(UTC)
    run = completed_run(engine, settings, db, now - timedelta(minutes=10))
    assert claim_due_chunks(engine, settings, now) == [[run]]
    assert claimed_until(db) >= now + timedelta(seconds=settings.claim_lease_s - 1)
    short = settings.model_copy(update={"settle_hold_lease_s": 1})
    with ThreadPoolExecutor(1) as pool:
        with raw_transaction(engine) as customer_lock:  # the chunk waits inside its task
            repo.lock_customers(customer_lock, [run])
            settling = pool.submit(settle_chunk, engine, short, [run])
            time.sleep(0.5)
            first = claimed_until(db)
            time.sleep(1.5)  # longer than the hold: renewed meanwhile, every third of it
            renewed = claimed_until(db)
        assert settling.result(timeout=30).decided == {run: 1}
    assert first < now + timedelta(seconds=10), "still on the sweep's lease"
    assert renewed > first + timedelta(seconds=1), "the hold was not renewed"
    assert db.execute("SELECT claimed_until, settle_attempts FROM runs").fetchone() == (None, 0)


def test_sweep_neither_waits_for_nor_parks_a_run_being_settled(engine, settings, db):
    now = datetime.now(UTC)
    completed_run(engine, settings, db, now - timedelta(minutes=10))
    # Four failed attempts, and a fifth under way past its hold: its claim has run out.
    db.execute(
        "UPDATE runs SET claimed_until = %s, settle_attempts = %s",
        (now - timedelta(seconds=1), settings.max_settle_attempts),
    )
    with ThreadPoolExecutor(1) as pool, psycopg.connect(db.info.dsn) as settling:
        settling.execute("SELECT id FROM runs FOR UPDATE")
        sweep = pool.submit(claim_due_chunks, engine, settings, now)
        try:
            chunks = sweep.result(timeout=5)
        except FutureTimeout:
            chunks = None
    assert chunks == [], "the sweep waited for the settling transaction"
    assert db.execute("SELECT parked_at FROM runs").fetchone() == (None,)
