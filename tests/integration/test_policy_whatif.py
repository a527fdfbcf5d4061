"""The what-if replay against a simulated month settled for real (issue #17).

Under the policy each decision was made with, the replay must reproduce every stored
decision exactly — across two policy versions, the R8 cap binding, a hold support released
and a run re-opened by late evidence. Under a candidate it reports what would change, and
it writes nothing.
"""

from __future__ import annotations

import os
import random
import signal
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from metering.db import raw_transaction
from metering.disputes.service import release_hold
from metering.keys import Principal, Scope
from metering.policies.defaults import settings_policy
from metering.policies.versions import create_version
from metering.policy.document import parse_policy
from metering.protection.query import protection_report
from metering.settlement import replay, replay_pool
from metering.settlement.replay_shards import Parallelism, replay_period_parallel
from metering.settlement.runner import settle_due_now
from tests.helpers.events import event
from tests.helpers.ingest import ingest
from tests.helpers.scenarios import KINDS, scenario

NOW = datetime.now(UTC).replace(microsecond=0)
START = NOW - timedelta(minutes=100)
TIGHT = {
    "cap_floor_micros": 0,
    "cap_fraction_ppm": 100_000,
    "rules": {"R7": {"action": "auto_refund", "under_micros": 12_000}},
}


def month(engine: Any, settings: Any, tenant: str) -> None:
    """60 mixed runs of 6 customers, settled in two passes, v1 in force from minute 30."""
    with raw_transaction(engine) as conn:
        create_version(
            conn,
            tenant,
            TIGHT,
            created_by="test",
            now=START,
            defaults=settings_policy(settings),
            effective_from=START + timedelta(minutes=30),
        )
    rng = random.Random(17)
    batches: list[list[dict[str, Any]]] = [[], []]
    for i in range(60):
        kind = rng.choice(sorted(KINDS))
        run_start = START + timedelta(minutes=i)
        batches[i % 2].extend(scenario(kind, f"run-{i}", f"cust-{i % 6}", run_start))
    ingest(engine, settings, batches[0], tenant=tenant)
    settle_due_now(engine, settings, now=NOW)
    ingest(engine, settings, batches[1], tenant=tenant)
    settle_due_now(engine, settings, now=NOW)


def whatif(engine: Any, settings: Any, tenant: str, period: str, document: Any) -> Any:
    defaults = settings_policy(settings)
    with raw_transaction(engine) as conn:
        return replay.replay_period(
            conn, tenant, period, parse_policy(document, defaults=defaults), defaults
        )


def test_replay_reproduces_every_stored_decision_and_prices_a_candidate(engine, settings, db):
    tenant = f"pol-{uuid.uuid4().hex[:12]}"
    month(engine, settings, tenant)
    held = db.execute(
        "SELECT subject FROM runs WHERE tenant_id = %s AND outcome = 'held_for_review' "
        "ORDER BY id LIMIT 1",
        (tenant,),
    ).fetchone()
    assert held is not None
    with raw_transaction(engine) as conn:
        release_hold(
            conn,
            Principal(tenant, Scope.SUPPORT, "test"),
            held[0],
            reason="checked the logs",
            settings=settings,
            now=NOW,
        )
    refunded = db.execute(
        "SELECT subject FROM runs WHERE tenant_id = %s AND outcome = 'refunded' AND "
        "ended_at > %s ORDER BY id LIMIT 1",
        (tenant, START + timedelta(minutes=30)),
    ).fetchone()
    if refunded is not None:  # late evidence: a step was delivered after all
        late = event(type="run.delivered", run=refunded[0], step=1, kind="partial", time=NOW)
        ingest(engine, settings, [late], tenant=tenant)
        settle_due_now(engine, settings, now=NOW + timedelta(minutes=5))
    rows = db.execute(
        "SELECT r.period, d.policy_version, d.rule_ids, d.outcome, r.gross_micros, "
        "r.billed_micros, r.credited_micros FROM runs r JOIN decisions d "
        "ON d.run_id = r.id AND d.version = r.decision_version WHERE r.tenant_id = %s",
        (tenant,),
    ).fetchall()
    assert len(rows) == 60
    assert {r[1] for r in rows} == {0, 1}  # both versions decided runs
    assert any("R8" in r[2] for r in rows), "the tight cap never bound"
    (period,) = {r[0] for r in rows}
    decisions_before = db.execute("SELECT count(*) FROM decisions").fetchone()

    same = whatif(engine, settings, tenant, period, {})
    assert (same.runs, same.reproduced, same.not_reproduced) == (60, 60, [])
    held_gross = sum(r[4] for r in rows if r[3] == "held_for_review")
    assert same.total.current.billed_micros == sum(r[5] for r in rows)
    assert same.total.current.credited_micros == sum(r[6] for r in rows)
    assert same.total.current.held_micros == held_gross
    assert len(same.customers) == 6

    generous = whatif(
        engine, settings, tenant, period, {"rules": {"R8": False, "R7": {"action": "hold"}}}
    )
    assert generous.reproduced == 60
    assert ("held_for_review", "refunded") in generous.changes
    assert generous.total.candidate.credited_micros > generous.total.current.credited_micros
    change = generous.changes[("held_for_review", "refunded")]
    assert 0 < len(change.examples) <= min(change.runs, 5)
    assert db.execute("SELECT count(*) FROM decisions").fetchone() == decisions_before

    # The cost columns: what the usage cost at the provider is the cost-of-protection
    # report's figure (one catalog), the same under both policies; what the credited lines
    # cost moves with what is credited; margin after protection is billed minus cost.
    with raw_transaction(engine) as conn:
        decided = protection_report(conn, tenant, period)
    for side in (same.total.current, same.total.candidate, generous.total.candidate):
        assert side.provider_cost_micros == decided.total.cost_micros > 0
        assert side.margin_after_micros == side.billed_micros - side.provider_cost_micros
    assert same.uncosted_lines == 0
    # The test catalog's costs are 60 % of its prices, and a credited line is credited
    # whole: protection cost 60 % of what was credited (each line's cost rounded alone).
    for side in (same.total.current, same.total.candidate, generous.total.candidate):
        assert abs(side.credited_provider_cost_micros * 5 - side.credited_micros * 3) <= 5 * 60
    assert 0 < same.total.current.credited_provider_cost_micros < same.total.current.credited_micros
    assert generous.total.candidate.credited_provider_cost_micros > (
        generous.total.current.credited_provider_cost_micros
    )


def test_a_period_replayed_on_three_processes_is_the_period_replayed_on_one(engine, settings, db):
    """The shards split the customers (none in two shards, none left out), read one snapshot
    and merge into the report one process gives: totals, customers, changes, checks."""
    tenant = f"pol-{uuid.uuid4().hex[:12]}"
    month(engine, settings, tenant)
    (period,) = db.execute(
        "SELECT DISTINCT period FROM runs WHERE tenant_id = %s", (tenant,)
    ).fetchone()
    (shards_used,) = db.execute(
        "SELECT count(DISTINCT (hashtext(customer_id) & 2147483647) %% 3) FROM runs "
        "WHERE tenant_id = %s",
        (tenant,),
    ).fetchone()
    assert shards_used >= 2  # the split is real: more than one process had customers
    candidate = {"rules": {"R8": False, "R7": {"action": "hold"}}}
    one = whatif(engine, settings, tenant, period, candidate)
    defaults = settings_policy(settings)
    parallelism = Parallelism(settings.libpq_url(), processes=3, from_runs=1)
    with raw_transaction(engine) as conn:
        three = replay_period_parallel(
            conn, tenant, period, parse_policy(candidate, defaults=defaults), defaults, parallelism
        )
    assert (three.runs, three.checked, three.reproduced) == (60, 60, 60)
    assert three.total == one.total
    assert three.customers == one.customers
    assert {k: c.runs for k, c in three.changes.items()} == {
        k: c.runs for k, c in one.changes.items()
    }
    assert three.uncosted_lines == one.uncosted_lines


def test_a_worker_process_killed_between_what_ifs_does_not_fail_the_next_one(engine, settings, db):
    """A killed worker breaks a process pool for good; the next what-if must still answer,
    the same as in one process (its shares replayed in the caller's snapshot), and the one
    after it gets fresh workers."""
    tenant = f"pol-{uuid.uuid4().hex[:12]}"
    month(engine, settings, tenant)
    (period,) = db.execute(
        "SELECT DISTINCT period FROM runs WHERE tenant_id = %s", (tenant,)
    ).fetchone()
    defaults = settings_policy(settings)
    candidate = parse_policy({"rules": {"R8": False}}, defaults=defaults)
    parallelism = Parallelism(settings.libpq_url(), processes=3, from_runs=1)
    one = whatif(engine, settings, tenant, period, {"rules": {"R8": False}})

    def parallel() -> Any:
        with raw_transaction(engine) as conn:
            return replay_period_parallel(conn, tenant, period, candidate, defaults, parallelism)

    parallel()  # the workers exist now
    pids = replay_pool.POOL.worker_pids()
    assert pids
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    for _ in range(2):
        again = parallel()
        assert (again.runs, again.checked, again.reproduced) == (60, 60, 60)
        assert again.total == one.total and again.customers == one.customers
