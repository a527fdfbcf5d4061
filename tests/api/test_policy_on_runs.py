"""The policy version that made a run's decision, as GET /v1/runs/{run} and the console's
"Why this outcome" show it (issue #17)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from metering.db import raw_transaction
from metering.policies.defaults import settings_policy
from metering.policies.versions import create_version
from metering.settlement.runner import settle_due_now
from tests.helpers.events import auth, event, usage
from tests.helpers.ingest import ingest
from tests.security.test_console_sessions import sign_in, visit

NOW = datetime.now(UTC).replace(microsecond=0)
T0 = NOW - timedelta(hours=2)


def completed_run(run: str) -> list[dict[str, object]]:
    return [
        usage(run=run, step=1, time=T0 + timedelta(minutes=1)),
        event(type="run.completed", run=run, time=T0 + timedelta(minutes=2)),
    ]


def test_the_run_document_and_the_console_name_the_policy_version(
    client, make_key, engine, settings
):
    tenant = f"pol-{uuid.uuid4().hex[:12]}"
    ingest(engine, settings, completed_run("old"), tenant=tenant)
    settle_due_now(engine, settings, now=NOW)
    with raw_transaction(engine) as conn:
        create_version(
            conn,
            tenant,
            {"cap_runs": 5},
            created_by="test",
            now=T0 - timedelta(hours=1),
            defaults=settings_policy(settings),
        )
    ingest(engine, settings, completed_run("new"), tenant=tenant)
    settle_due_now(engine, settings, now=NOW)
    key = make_key(tenant=tenant, scope="admin")
    old = client.get("/v1/runs/old", headers=auth(key)).json()
    new = client.get("/v1/runs/new", headers=auth(key)).json()
    assert (old["policy_version"], [d["policy_version"] for d in old["decisions"]]) == (0, [0])
    assert (new["policy_version"], [d["policy_version"] for d in new["decisions"]]) == (1, [1])
    token = sign_in(client, key)
    page = visit(client, token, "/console/runs/new")
    assert page.status_code == 200, page.text
    assert "version 1 of the tenant" in page.text
    assert "version 0 (the deployment" in visit(client, token, "/console/runs/old").text
