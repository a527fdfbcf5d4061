"""Per-tenant policy versions against the real database (issue #17).

The version in force at a run's end decides it, every decision records that version, a new
version never rewrites a decision, and a re-opened run is re-settled under the version in
force at its end. Each test has its own tenant: policy versions are append-only, so tests
never truncate them and must not share a tenant's versions.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from metering.db import raw_transaction
from metering.errors import MeteringError
from metering.policies.defaults import settings_policy
from metering.policies.versions import create_version, get_version, list_versions
from metering.settlement.runner import settle_due_now
from tests.helpers.events import event, usage
from tests.helpers.ingest import ingest

NOW = datetime.now(UTC).replace(microsecond=0)
T0 = NOW - timedelta(hours=3)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def new_tenant() -> str:
    return f"pol-{uuid.uuid4().hex[:12]}"


def write_policy(
    engine: Any, settings: Any, tenant: str, document: dict[str, Any], *, effective: datetime
) -> int:
    """A version in force from ``effective``, written as if now were that moment."""
    with raw_transaction(engine) as conn:
        version = create_version(
            conn,
            tenant,
            document,
            created_by="test",
            now=effective,
            defaults=settings_policy(settings),
        )
    return version.version


def server_drop(run: str, *, start: float) -> list[dict[str, Any]]:
    """A run cut by a server-side drop before anything was delivered: R4 refunds it."""
    return [
        event(type="run.started", run=run, time=at(start), attempt=1),
        usage(run=run, step=1, time=at(start + 1)),
        usage(run=run, step=2, time=at(start + 2)),
        event(type="connection.lost", run=run, side="server", reason="lb", time=at(start + 3)),
        event(type="run.failed", run=run, cause="network", time=at(start + 4)),
    ]


def decisions(db: Any, tenant: str, run: str) -> list[tuple[Any, ...]]:
    return db.execute(
        "SELECT d.version, d.outcome, d.policy_version FROM decisions d "
        "JOIN runs r ON r.id = d.run_id WHERE r.tenant_id = %s AND r.subject = %s "
        "ORDER BY d.version",
        (tenant, run),
    ).fetchall()


def test_policy_versions_refuse_update_delete_and_truncate(engine, settings, db):
    tenant = new_tenant()
    write_policy(engine, settings, tenant, {"cap_runs": 3}, effective=NOW)
    for statement in (
        "UPDATE policy_versions SET document = '{}'",
        "DELETE FROM policy_versions",
        "TRUNCATE policy_versions",
    ):
        with pytest.raises(psycopg.errors.RestrictViolation, match="append-only"):
            db.execute(statement)
    assert db.execute(
        "SELECT count(*) FROM policy_versions WHERE tenant_id = %s", (tenant,)
    ).fetchone() == (1,)


def test_a_tenant_without_a_policy_is_decided_by_version_0_the_settings(engine, settings, db):
    tenant = new_tenant()
    ingest(engine, settings, server_drop("run-1", start=0), tenant=tenant)
    settle_due_now(engine, settings, now=NOW)
    assert decisions(db, tenant, "run-1") == [(1, "refunded", 0)]


def test_the_version_in_force_at_the_runs_end_decides_it(engine, settings, db):
    tenant, other = new_tenant(), new_tenant()
    write_policy(engine, settings, tenant, {"rules": {"R4": False}}, effective=at(30))
    events = server_drop("before", start=0) + server_drop("after", start=40)
    ingest(engine, settings, events, tenant=tenant)
    ingest(engine, settings, server_drop("after", start=40), tenant=other)
    settle_due_now(engine, settings, now=NOW)
    assert decisions(db, tenant, "before") == [(1, "refunded", 0)]
    assert decisions(db, tenant, "after") == [(1, "confirmed", 1)]
    # Another tenant's policy is not this one's.
    assert decisions(db, other, "after") == [(1, "refunded", 0)]


def test_a_new_version_never_rewrites_a_decision(engine, settings, db):
    tenant = new_tenant()
    ingest(engine, settings, server_drop("run-1", start=0), tenant=tenant)
    settle_due_now(engine, settings, now=NOW)
    write_policy(engine, settings, tenant, {"rules": {"R4": False}}, effective=NOW)
    settle_due_now(engine, settings, now=NOW + timedelta(hours=2))
    assert decisions(db, tenant, "run-1") == [(1, "refunded", 0)]


def test_a_reopened_run_is_resettled_under_the_version_in_force_at_its_end(engine, settings, db):
    tenant = new_tenant()
    # v1 from minute 30: no refunds of interrupted runs (partial credit stays on).
    write_policy(engine, settings, tenant, {"rules": {"R4": False}}, effective=at(30))
    ingest(engine, settings, server_drop("run-1", start=40), tenant=tenant)
    settle_due_now(engine, settings, now=NOW)
    assert decisions(db, tenant, "run-1") == [(1, "confirmed", 1)]
    # v2 from now: no partial credit either. The run ended under v1, so v1 still decides it.
    write_policy(engine, settings, tenant, {"rules": {"R5": False}}, effective=NOW)
    late = event(type="run.delivered", run="run-1", step=1, kind="partial", time=at(41.5))
    ingest(engine, settings, [late], tenant=tenant)
    settle_due_now(engine, settings, now=NOW + timedelta(minutes=5))
    assert decisions(db, tenant, "run-1") == [(1, "confirmed", 1), (2, "partially_credited", 1)]


def test_versions_are_numbered_per_tenant_and_never_go_back_in_time(engine, settings, db):
    tenant, other = new_tenant(), new_tenant()
    assert write_policy(engine, settings, tenant, {"cap_runs": 5}, effective=at(10)) == 1
    assert write_policy(engine, settings, tenant, {"cap_floor_micros": 0}, effective=at(20)) == 2
    assert write_policy(engine, settings, other, {}, effective=at(20)) == 1
    defaults = settings_policy(settings)
    with raw_transaction(engine) as conn:
        versions = list_versions(conn, tenant, defaults)
        # Fields a version leaves out keep the previous version's values.
        seen = [(v.version, v.document.cap_runs, v.document.cap_floor_micros) for v in versions]
        assert seen == [
            (0, defaults.cap_runs, defaults.cap_floor_micros),
            (1, 5, defaults.cap_floor_micros),
            (2, 5, 0),
        ]
        assert get_version(conn, tenant, 0, defaults).document == defaults
    with (
        pytest.raises(MeteringError, match="effective_from") as caught,
        raw_transaction(engine) as conn,
    ):
        create_version(
            conn, tenant, {}, created_by="t", now=at(25), defaults=defaults, effective_from=at(15)
        )
    assert caught.value.status == 422


def test_a_tenants_windows_decide_when_its_runs_are_due(engine, settings, db):
    """settle_grace_s, resume_window_s and idle_timeout_s of the policy in force: a run that
    ended 10 minutes ago is due for a tenant whose grace is 5 minutes, not for one whose
    grace is an hour; a run silent for 40 minutes is due for a tenant whose idle timeout is
    30 minutes, not under the deployment's hour. The sweep and settlement agree."""
    quick, patient, plain = new_tenant(), new_tenant(), new_tenant()
    write_policy(
        engine, settings, quick, {"settle_grace_s": 300, "idle_timeout_s": 1800}, effective=T0
    )
    write_policy(engine, settings, patient, {"settle_grace_s": 3600}, effective=T0)
    now = at(60)
    for tenant in (quick, patient, plain):
        ingest(engine, settings, server_drop("ended", start=46), tenant=tenant)  # ends at 50
        ingest(
            engine,
            settings,
            [
                event(type="run.started", run="silent", time=at(10)),
                usage(run="silent", step=1, time=at(20)),
            ],
            tenant=tenant,
        )
    settle_due_now(engine, settings, now=now)
    assert decisions(db, quick, "ended") == [(1, "refunded", 1)]
    assert decisions(db, quick, "silent") != []  # 40 min silent > its 30 min idle timeout
    assert decisions(db, patient, "ended") == []  # 10 min < its hour of grace
    assert decisions(db, plain, "ended") == [(1, "refunded", 0)]  # the deployment's 120 s
    assert decisions(db, plain, "silent") == []  # 40 min < the deployment's hour
    later = at(50 + 61)
    settle_due_now(engine, settings, now=later)
    assert decisions(db, patient, "ended") == [(1, "refunded", 1)]
