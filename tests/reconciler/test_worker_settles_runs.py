"""The real worker, driven by beat, settles a few hundred mixed runs unattended."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

from celery import Celery

from tests.helpers.ingest import ingest
from tests.helpers.processes import wait_until
from tests.helpers.scenarios import KINDS, scenario

NOW = datetime.now(UTC)
START = NOW - timedelta(minutes=30)


def test_worker_settles_mixed_runs_with_right_outcomes_and_reconciled_ledger(
    reconciler_processes, engine, settings, db
):
    rng = random.Random(7)
    expected: dict[str, str] = {}
    batch: list[dict[str, Any]] = []
    for i in range(300):
        kind = rng.choice(sorted(KINDS))
        run, customer = f"run-{i}", f"cust-{i % 40}"
        expected[run] = KINDS[kind]
        batch.extend(scenario(kind, run, customer, START))
        if len(batch) > 900:
            ingest(engine, settings, batch)
            batch = []
    ingest(engine, settings, batch)

    def all_settled() -> bool:
        return (
            db.execute("SELECT count(*) FROM runs WHERE decision_version > 0").fetchone()[0] == 300
        )

    assert wait_until(all_settled, timeout_s=120), "the worker did not settle every run"
    actual = dict(db.execute("SELECT subject, outcome FROM runs").fetchall())
    assert actual == expected
    assert db.execute("SELECT count(*) FROM decisions").fetchone() == (300,)
    per_customer = db.execute(
        "SELECT customer_id, "
        "sum(amount_micros) FILTER (WHERE kind = 'hold'), "
        "coalesce(sum(amount_micros) FILTER (WHERE kind = 'post' OR corrects = 'billed'), 0), "
        "coalesce(sum(amount_micros) FILTER (WHERE kind = 'release' OR corrects = 'credited'), 0),"
        "(SELECT coalesce(sum(r.gross_micros), 0) FROM runs r WHERE r.customer_id = l.customer_id "
        " AND r.outcome = 'held_for_review') "
        "FROM ledger_entries l GROUP BY customer_id"
    ).fetchall()
    assert len(per_customer) == 40
    for customer, gross, billed, credited, held in per_customer:
        assert gross == billed + credited + held, customer


def test_redelivered_settle_task_makes_one_decision_version(
    reconciler_processes, engine, settings, db
):
    ingest(engine, settings, scenario("server-drop", "redelivered", "cust-r", START))
    run_id = db.execute("SELECT id FROM runs").fetchone()[0]
    app = Celery(broker=reconciler_processes["env"]["REDIS_URL"])
    for _ in range(2):
        app.send_task("fairmeter.settle_run_chunk", args=[[run_id]])

    def decided() -> bool:
        return db.execute("SELECT decision_version FROM runs").fetchone()[0] > 0

    assert wait_until(decided, timeout_s=30)
    # Give the duplicate delivery (and the beat's sweeps) time to run, then count versions.
    wait_until(lambda: False, timeout_s=3)
    assert db.execute("SELECT count(*) FROM decisions").fetchone() == (1,)
    assert db.execute("SELECT outcome FROM runs").fetchone() == ("refunded",)
