"""The real worker, driven by beat, tells each run's settlement in order: ``run.settled``,
then after a late event ``run.status_changed`` (settling again) and ``run.resettled`` with
what changed — each once, per run in ascending ids."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

from celery import Celery

from metering.policy.status import COMPLETED, RESETTLING, SETTLING
from tests.helpers.events import usage
from tests.helpers.ingest import ingest
from tests.helpers.processes import wait_until
from tests.helpers.scenarios import KINDS, scenario

NOW = datetime.now(UTC)
START = NOW - timedelta(minutes=30)


def told(db: Any, run: str) -> list[tuple[int, str, dict[str, Any]]]:
    rows = db.execute(
        "SELECT id, type, data FROM notifications WHERE subject = %s ORDER BY id", (run,)
    ).fetchall()
    return [(r[0], r[1], r[2]) for r in rows]


def has(db: Any, run: str, type_: str) -> bool:
    return any(t == type_ for _, t, _ in told(db, run))


def test_settled_then_reopened_then_resettled_in_order(reconciler_processes, engine, settings, db):
    ingest(engine, settings, scenario("completed", "r1", "c1", START))
    assert wait_until(lambda: has(db, "r1", "run.settled"), timeout_s=120)
    assert wait_until(lambda: len(told(db, "r1")) == 3, timeout_s=30)
    late = usage(
        run="r1", customer="c1", step=3, model="agent-small-1", time=START + timedelta(minutes=2)
    )
    ingest(engine, settings, [late])
    assert wait_until(lambda: has(db, "r1", "run.resettled"), timeout_s=120)
    assert wait_until(lambda: len(told(db, "r1")) == 6, timeout_s=30)
    wait_until(lambda: False, timeout_s=3)  # more sweeps: nothing more to say
    notes = told(db, "r1")
    assert [t for _, t, _ in notes] == [
        "run.status_changed",
        "run.settled",
        "run.status_changed",
        "run.status_changed",
        "run.resettled",
        "run.status_changed",
    ]
    ids = [i for i, _, _ in notes]
    assert ids == sorted(ids)
    words = [d["status"] for _, t, d in notes if t == "run.status_changed"]
    assert words == [SETTLING, COMPLETED, RESETTLING, COMPLETED]
    settled, resettled = notes[1][2], notes[4][2]
    late_micros = resettled["gross_micros"] - settled["gross_micros"]
    assert late_micros > 0
    assert resettled["decision_version"] == 2 and resettled["previous_decision_version"] == 1
    assert resettled["changes"] == {
        "billed_micros": {
            "before": settled["billed_micros"],
            "after": settled["billed_micros"] + late_micros,
        },
        "held_micros": {"before": late_micros, "after": 0},
    }


def test_a_busy_worker_tells_every_run_once_with_its_own_tenant_and_customer(
    reconciler_processes, engine, settings, db
):
    rng = random.Random(16)
    expected: dict[str, str] = {}
    batches: dict[str, list[dict[str, Any]]] = {"acme": [], "globex": []}
    for i in range(120):
        kind = rng.choice(sorted(KINDS))
        run, customer = f"busy-{i}", f"cust-{i % 9}"
        expected[run] = KINDS[kind]
        batches["acme" if i % 2 else "globex"].extend(scenario(kind, run, customer, START))
    for tenant, events in batches.items():
        ingest(engine, settings, events, tenant=tenant)

    def all_settled() -> bool:
        row = db.execute("SELECT count(*) FROM runs WHERE decision_version > 0").fetchone()
        return bool(row[0] == 120)

    assert wait_until(all_settled, timeout_s=120)
    wait_until(lambda: False, timeout_s=3)
    counts = dict(
        db.execute(
            "SELECT type, count(*) FROM notifications GROUP BY type",
        ).fetchall()
    )
    held = sum(1 for outcome in expected.values() if outcome == "held_for_review")
    assert counts == {"run.status_changed": 240, "run.settled": 120, "run.held": held}
    strangers = db.execute(
        "SELECT count(*) FROM notifications n JOIN runs r ON r.id = n.run_id "
        "WHERE (n.tenant_id, n.customer_id, n.subject) <> (r.tenant_id, r.customer_id, r.subject)"
        "   OR n.data->>'customer' <> r.customer_id OR n.data->>'run' <> r.subject"
    ).fetchone()
    assert strangers == (0,)
    last_words = db.execute(
        "SELECT count(*) FROM runs r WHERE r.status IS DISTINCT FROM (SELECT n.data->>'status' "
        "FROM notifications n WHERE n.run_id = r.id AND n.type = 'run.status_changed' "
        "ORDER BY n.id DESC LIMIT 1)"
    ).fetchone()
    assert last_words == (0,)


def test_a_redelivered_settle_task_tells_once(reconciler_processes, engine, settings, db):
    ingest(engine, settings, scenario("server-drop", "twice", "cust-r", START))
    run_id = db.execute("SELECT id FROM runs").fetchone()[0]
    app = Celery(broker=reconciler_processes["env"]["REDIS_URL"])
    for _ in range(2):
        app.send_task("fairmeter.settle_run_chunk", args=[[run_id]])
    assert wait_until(lambda: has(db, "twice", "run.settled"), timeout_s=60)
    wait_until(lambda: False, timeout_s=3)
    assert [t for _, t, _ in told(db, "twice")] == [
        "run.status_changed",
        "run.settled",
        "run.status_changed",
    ]
