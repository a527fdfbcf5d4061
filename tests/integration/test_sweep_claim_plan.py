"""The sweep's claim probes the runs it claims by key, however many runs are stored (issue #18).

The planner estimates the claim's ``due`` set at its LIMIT (the sweep's batch size); joined
to ``runs`` as a table, that estimate made it hash a sequential scan of every stored run
(the growth bench saw it at 20,000 and 220,000 runs), so a sweep cost more as settled
history grew, though its work is only the due runs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from devtools.bulk import settled_runs
from metering.settlement.due import CLAIM_DUE_RUNS, Windows, claim_due_runs, claim_params

NOW = datetime.now(UTC)
HISTORY = 40_000  # settled runs: enough for the planner to prefer hashing the whole table
IN_FLIGHT = 2_000
DUE = 200  # completed ten minutes ago; the others had an event in the last half hour
DUE_IDS = "SELECT id FROM runs WHERE subject LIKE 'flight-%' AND terminal_at IS NOT NULL"


def store_runs(db: Any) -> None:
    """A settled history, then runs in flight of which ``DUE`` are due, and ANALYZE."""
    settled_runs(db, tenant="acme", customer="history", count=HISTORY, period="2026-01")
    db.execute(
        "INSERT INTO customers (tenant_id, id) "
        "SELECT 'acme', 'c' || g FROM generate_series(0, 49) g"
    )
    db.execute(
        """
        INSERT INTO runs (tenant_id, subject, customer_id, first_event_at, last_event_at,
            last_received_at, terminal_at, event_count, gross_micros, evidence_version)
        SELECT 'acme', 'flight-' || g, 'c' || (g %% 50), t - interval '5 minutes', t, t,
               CASE WHEN g <= %(due)s THEN t END, 10, 1000, 10
        FROM generate_series(1, %(in_flight)s) g,
             LATERAL (SELECT %(now)s::timestamptz - CASE WHEN g <= %(due)s
                 THEN interval '10 minutes' ELSE (g %% 1800) * interval '1 second' END AS t) x
        """,
        {"due": DUE, "in_flight": IN_FLIGHT, "now": NOW},
    )
    db.execute("ANALYZE runs")


def sweep(settings: Any) -> dict[str, Any]:
    """The deployment's windows, batch and lease, as the worker's sweep passes them."""
    return {
        "windows": Windows.from_settings(settings),
        "limit": settings.sweep_batch_size,
        "lease": timedelta(seconds=settings.claim_lease_s),
    }


def nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from nodes(child)


def test_the_claim_updates_its_due_runs_through_the_primary_key(db, settings):
    store_runs(db)
    params = claim_params(NOW, **sweep(settings))
    (plan,) = db.execute("EXPLAIN (FORMAT JSON) " + CLAIM_DUE_RUNS, params).fetchone()
    update = (plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"]
    # The UPDATE side: all but the CTE that picks (and locks) the due runs.
    update_side = [
        node
        for child in update["Plans"]
        if child.get("Subplan Name") != "CTE due"
        for node in nodes(child)
    ]
    shape = [(n["Node Type"], n.get("Relation Name"), n.get("Index Name")) for n in update_side]
    reads_of_runs = [n for n in update_side if n.get("Relation Name") == "runs"]
    assert reads_of_runs, shape
    assert all(
        n["Node Type"] == "Index Scan" and n["Index Name"] == "pk_runs" and "Index Cond" in n
        for n in reads_of_runs
    ), shape
    assert not any(n["Node Type"] in ("Hash Join", "Merge Join") for n in update_side), shape

    with db.transaction():  # and it still claims exactly the due runs
        claimed = claim_due_runs(db, NOW, **sweep(settings))
    assert {c.run_id for c in claimed} == {r for (r,) in db.execute(DUE_IDS)}


def test_the_claim_reads_only_due_runs_however_many_settled_runs_share_their_clocks(db, settings):
    """Settled runs keep their clocks (terminal_at long past), and the planner takes its
    estimate for a partial index's range from the whole table: with much settled history it
    judged most pending runs due and read every one of them through ``ix_runs_pending``,
    filtering out all but the due (the growth bench: 211,787 read for 2,000 due, CPU x2).
    Each clock's range must be read from its own index, whatever the estimate."""
    store_runs(db)
    params = claim_params(NOW, **sweep(settings))
    with db.transaction():
        (plan,) = db.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + CLAIM_DUE_RUNS, params).fetchone()
        db.execute("ROLLBACK")  # the EXPLAIN ANALYZE claimed: undo it
    root = (plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"]
    pending_reads = [
        n
        for n in nodes(root)
        if str(n.get("Index Name", "")).startswith("ix_runs_pending")
        and n.get("Index Name") != "ix_runs_pending_claimed_until"
    ]
    assert pending_reads
    shape = [(n["Index Name"], n.get("Index Cond"), n["Actual Rows"]) for n in pending_reads]
    assert all("Index Cond" in n for n in pending_reads), shape
    read = sum(n["Actual Rows"] + n.get("Rows Removed by Filter", 0) for n in pending_reads)
    assert read <= 2 * DUE, shape


def test_the_claim_is_never_jit_compiled(db, settings):
    """With a million runs stored the claim's estimated cost passes jit_above_cost, and
    compiling it took 64 ms of a 264 ms claim of 2,000 runs (growth bench)."""
    with db.transaction():
        db.execute("SET LOCAL jit_above_cost = 0")
        claim_due_runs(db, NOW, **sweep(settings))
        assert db.execute("SHOW jit").fetchone() == ("off",)
        db.execute("ROLLBACK")
