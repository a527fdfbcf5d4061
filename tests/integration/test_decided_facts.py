"""Each decision keeps the facts it was made on, and a what-if replays from them (#17).

The record is a cache of facts whose source of truth is the events and usage-line tables:
it must say exactly what they say for the decision's run, and a replay of decisions that
kept none (made before migration 0022) must come to the same report as one that reads the
records.
"""

from __future__ import annotations

import uuid
from typing import Any

from metering.db import raw_transaction
from metering.policies.defaults import settings_policy
from metering.policy.document import parse_policy
from metering.settlement import replay
from metering.settlement.decided_facts import decode_decided_facts
from metering.settlement.repo import load_evidence
from tests.integration.test_policy_whatif import month, whatif


def _latest(db: Any, tenant: str) -> list[tuple[int, bytes | None]]:
    return db.execute(
        "SELECT r.id, d.facts FROM runs r JOIN decisions d "
        "ON d.run_id = r.id AND d.version = r.decision_version WHERE r.tenant_id = %s",
        (tenant,),
    ).fetchall()


def test_each_decision_keeps_exactly_the_facts_of_its_run(engine, settings, db):
    tenant = f"df-{uuid.uuid4().hex[:12]}"
    month(engine, settings, tenant)
    decided = _latest(db, tenant)
    assert len(decided) == 60
    with raw_transaction(engine) as conn:
        evidence = load_evidence(conn, [run_id for run_id, _ in decided])
    for run_id, record in decided:
        facts = decode_decided_facts(record)
        assert facts is not None, f"run {run_id} kept no record"
        events = [e for e in evidence.events[run_id] if e.type != "run.usage"]
        assert sorted(facts.events, key=lambda e: e.event_id) == sorted(
            events, key=lambda e: e.event_id
        )
        by_line = dict(zip(facts.usage, facts.pricing, strict=True))
        stored = dict(
            zip(evidence.usage.get(run_id, []), evidence.pricing.get(run_id, []), strict=True)
        )
        assert by_line == stored


def test_decisions_without_a_record_replay_as_the_ones_with_one(engine, settings, db):
    tenant = f"df-{uuid.uuid4().hex[:12]}"
    month(engine, settings, tenant)
    (period,) = db.execute(
        "SELECT DISTINCT period FROM runs WHERE tenant_id = %s", (tenant,)
    ).fetchone()
    candidate = {"rules": {"R8": False, "R7": {"action": "hold"}}}
    recorded = whatif(engine, settings, tenant, period, candidate)

    # As if made before records were kept (NULL), or kept in a format this code does not
    # know (a later one): decisions are append-only, so the trigger is bypassed here.
    runs = sorted(run_id for run_id, _ in _latest(db, tenant))
    with raw_transaction(engine) as conn:
        conn.execute("SET LOCAL session_replication_role = replica")
        conn.execute(
            "UPDATE decisions SET facts = NULL WHERE run_id = ANY(%s)", (runs[: len(runs) // 2],)
        )
        conn.execute(
            "UPDATE decisions SET facts = %s WHERE run_id = ANY(%s)",
            (b"\x94\x02\x90\x90\x90", runs[len(runs) // 2 : len(runs) // 2 + 5]),
        )
    assert sum(record is None for _, record in _latest(db, tenant)) == len(runs) // 2
    from_tables = whatif(engine, settings, tenant, period, candidate)

    assert (from_tables.runs, from_tables.checked, from_tables.reproduced) == (60, 60, 60)
    assert from_tables.total == recorded.total
    assert from_tables.customers == recorded.customers
    assert {k: c.runs for k, c in from_tables.changes.items()} == {
        k: c.runs for k, c in recorded.changes.items()
    }
    assert from_tables.uncosted_lines == recorded.uncosted_lines


def test_a_replay_of_recorded_decisions_reads_neither_events_nor_usage_lines(engine, settings, db):
    """The point of the record: with empty stand-ins shadowing the two tables (temporary
    tables come first on the search path), the replay still reproduces every decision."""
    tenant = f"df-{uuid.uuid4().hex[:12]}"
    month(engine, settings, tenant)
    (period,) = db.execute(
        "SELECT DISTINCT period FROM runs WHERE tenant_id = %s", (tenant,)
    ).fetchone()
    candidate = {"rules": {"R8": False}}
    read = whatif(engine, settings, tenant, period, candidate)
    defaults = settings_policy(settings)
    with raw_transaction(engine) as conn:
        conn.execute("CREATE TEMP TABLE events (LIKE public.events) ON COMMIT DROP")
        conn.execute("CREATE TEMP TABLE usage_lines (LIKE public.usage_lines) ON COMMIT DROP")
        assert conn.execute("SELECT count(*) FROM events").fetchone() == (0,)
        shadowed = replay.replay_period(
            conn, tenant, period, parse_policy(candidate, defaults=defaults), defaults
        )
    assert (shadowed.runs, shadowed.reproduced) == (60, 60)
    assert shadowed.total == read.total
    assert shadowed.customers == read.customers
