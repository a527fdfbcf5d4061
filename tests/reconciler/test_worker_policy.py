"""The real worker, driven by beat, settles each tenant's runs under its own policy version
(issue #17)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from metering.db import raw_transaction
from metering.policies.defaults import settings_policy
from metering.policies.versions import create_version
from tests.helpers.ingest import ingest
from tests.helpers.processes import wait_until
from tests.helpers.scenarios import scenario

NOW = datetime.now(UTC)
START = NOW - timedelta(minutes=30)


def test_worker_settles_each_tenant_under_the_policy_in_force(
    reconciler_processes, engine, settings, db
):
    strict, default = f"pol-{uuid.uuid4().hex[:12]}", f"pol-{uuid.uuid4().hex[:12]}"
    with raw_transaction(engine) as conn:
        # No refunds of interrupted runs for this tenant, from before its runs began.
        create_version(
            conn,
            strict,
            {"rules": {"R4": False}},
            created_by="test",
            now=START - timedelta(hours=1),
            defaults=settings_policy(settings),
        )
    for tenant in (strict, default):
        events = []
        for i in range(5):
            events.extend(scenario("server-drop", f"run-{i}", f"cust-{i}", START))
        ingest(engine, settings, events, tenant=tenant)

    def all_settled() -> bool:
        row = db.execute("SELECT count(*) FROM runs WHERE decision_version > 0").fetchone()
        return row is not None and row[0] == 10

    assert wait_until(all_settled, timeout_s=60), "the worker did not settle every run"
    rows = db.execute(
        "SELECT r.tenant_id, d.outcome, d.policy_version, count(*) FROM decisions d "
        "JOIN runs r ON r.id = d.run_id GROUP BY 1, 2, 3"
    ).fetchall()
    assert sorted(rows) == sorted([(strict, "confirmed", 1, 5), (default, "refunded", 0, 5)])
