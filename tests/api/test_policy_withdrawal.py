"""A far-future ``effective_from`` must not lock a tenant's policy for good (issue #30, item 3):
the horizon refuses a mistyped year, and an admin withdraws a version not yet in effect."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from metering.db import raw_transaction
from metering.policies.defaults import settings_policy
from metering.policies.versions import create_version, load_book
from tests.helpers import ROOT
from tests.helpers.events import auth
from tests.helpers.processes import service_env

JSON = {"content-type": "application/json"}
MISTYPED = datetime(2062, 12, 10, tzinfo=UTC)  # 2062 for 2026


@pytest.fixture
def tenant(make_key) -> tuple[str, str]:
    """(tenant, admin key): policy versions are append-only and outlive a test."""
    name = f"pol-{uuid.uuid4().hex[:12]}"
    return name, str(make_key(tenant=name, scope="admin"))


def create(client: Any, key: str, **body: Any) -> Any:
    return client.post("/v1/policies", content=json.dumps(body), headers=auth(key, **JSON))


def withdraw(client: Any, key: str, version: int, **body: Any) -> Any:
    return client.post(
        f"/v1/policies/{version}/withdraw", content=json.dumps(body), headers=auth(key, **JSON)
    )


def test_an_effective_from_beyond_the_horizon_is_refused_naming_it(client, tenant):
    _, key = tenant
    for far in ("9999-12-31T23:59:59Z", MISTYPED.isoformat()):
        refused = create(client, key, document={}, effective_from=far)
        assert refused.status_code == 422, refused.text
        [error] = refused.json()["errors"]
        assert (error["path"], error["code"]) == ("$.effective_from", "effective_from_too_far")
        assert "366 days" in error["message"]
    within = datetime.now(UTC) + timedelta(days=365)
    made = create(client, key, document={"cap_runs": 7}, effective_from=within.isoformat())
    assert made.status_code == 201, made.text
    assert (made.json()["version"], made.json()["in_force"]) == (1, False)


def test_a_withdrawn_version_is_never_in_force_and_the_tenant_writes_again(
    client, tenant, engine, settings
):
    name, key = tenant
    assert create(client, key, document={"cap_runs": 3}).status_code == 201
    # Written before the horizon existed (the use case without one, as main's API did).
    with raw_transaction(engine) as conn:
        create_version(
            conn,
            name,
            {"cap_runs": 99},
            created_by="before-the-horizon",
            now=datetime.now(UTC),
            defaults=settings_policy(settings),
            effective_from=MISTYPED,
        )
    soon = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    stuck = create(client, key, document={}, effective_from=soon)
    assert stuck.status_code == 422  # before the scheduled version's start: as documented
    unsent = create(client, key, document={})
    assert unsent.status_code == 409, unsent.text  # never a 422 about a field not sent
    assert (unsent.json()["code"], unsent.json()["version"]) == ("policy_version_scheduled", 2)

    done = withdraw(client, key, 2, reason="2062 was meant to be 2026")
    assert done.status_code == 200, done.text
    body = done.json()
    assert (body["version"], body["in_force"], body["document"]["cap_runs"]) == (2, False, 99)
    assert body["withdrawn"]["reason"] == "2062 was meant to be 2026"
    third = create(client, key, document={})  # now, over version 1 (not the withdrawn 2)
    assert (third.status_code, third.json()["version"]) == (201, 3), third.text
    assert body["withdrawn"]["withdrawn_by"] == third.json()["created_by"]  # the key's id
    again = withdraw(client, key, 2, reason="another reason")
    assert (again.status_code, again.json()) == (200, body)  # idempotent: the same result

    listed = client.get("/v1/policies", headers=auth(key)).json()
    assert [(p["version"], p["in_force"], p["withdrawn"] is not None) for p in listed] == [
        (0, False, False),
        (1, False, False),
        (2, False, True),
        (3, True, False),
    ]
    assert listed[3]["document"]["cap_runs"] == 3  # kept from version 1, not the withdrawn 2
    assert client.get("/v1/policies/2", headers=auth(key)).json()["withdrawn"] == body["withdrawn"]
    later = create(client, key, document={"cap_runs": 4}, effective_from=soon)
    assert later.status_code == 201, later.text
    assert later.json()["version"] == 4
    # Settlement never uses it: the version in force in 2063 is 4, not the withdrawn 2.
    with raw_transaction(engine) as conn:
        book = load_book(conn, [name], settings_policy(settings))
    assert book.in_force(name, MISTYPED + timedelta(days=365)).version == 4


def test_only_a_version_not_yet_in_effect_can_be_withdrawn(client, tenant, make_key):
    name, key = tenant
    assert create(client, key, document={}).status_code == 201
    for version in (0, 1):  # the settings, and a version in force
        refused = withdraw(client, key, version)
        assert refused.status_code == 409, refused.text
        assert refused.json()["code"] == "policy_version_in_force"
    unknown = withdraw(client, key, 7)
    assert (unknown.status_code, unknown.json()["code"]) == (404, "policy_version_not_found")
    scheduled = datetime.now(UTC) + timedelta(days=2)
    assert create(client, key, document={}, effective_from=scheduled.isoformat()).status_code == 201
    assert withdraw(client, key, 2).status_code == 200  # {}: no reason
    assert client.get("/v1/policies/2", headers=auth(key)).json()["withdrawn"]["reason"] == ""
    from tests.security.test_console_sessions import sign_in, visit

    page = visit(client, sign_in(client, key), "/console/policies").text
    assert '<tr data-version="2">' in page and 'data-state="withdrawn"' in page
    assert "In force: version 1" in page
    too_long = withdraw(client, key, 2, reason="x" * 2001)
    assert too_long.status_code == 422
    assert too_long.json()["errors"][0]["path"] == "$.reason"
    support = make_key(tenant=name, scope="support")
    assert withdraw(client, support, 2).status_code == 403


def test_withdrawals_are_append_only(client, tenant, db):
    _, key = tenant
    later = datetime.now(UTC) + timedelta(days=1)
    assert create(client, key, document={}, effective_from=later.isoformat()).status_code == 201
    assert withdraw(client, key, 1).status_code == 200
    for statement in (
        "UPDATE policy_withdrawals SET reason = 'edited'",
        "DELETE FROM policy_withdrawals",
        "TRUNCATE policy_withdrawals",
    ):
        with pytest.raises(psycopg.errors.RestrictViolation, match="append-only"):
            db.execute(statement)


def test_the_cli_withdraws_a_scheduled_version_and_keeps_the_horizon(client, tenant, settings):
    name, key = tenant
    later = datetime.now(UTC) + timedelta(days=30)
    assert create(client, key, document={}, effective_from=later.isoformat()).status_code == 201

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "cli", "policy", *args, "--tenant", name],
            cwd=ROOT,
            env=service_env(settings),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    far = cli("set", "--set", "cap_runs=1", "--effective-from", "9999-12-31T23:59:59+00:00")
    assert far.returncode != 0 and "effective_from_too_far" in far.stderr, far.stderr
    done = cli("withdraw", "--version", "1", "--reason", "wrong month")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("version 1 withdrawn at ")
    shown = client.get("/v1/policies/1", headers=auth(key)).json()["withdrawn"]
    assert (shown["withdrawn_by"], shown["reason"]) == ("cli", "wrong month")


def test_the_console_reads_a_version_s_changes_against_the_one_it_replaces_not_a_withdrawn_one(
    client, tenant
):
    """Version 3 follows version 1 in force (2 was withdrawn before it took effect): its
    changes are read against 1, so the console shows the one change a person made."""
    from tests.security.test_console_sessions import sign_in, visit

    _, key = tenant
    assert create(client, key, document={"cap_runs": 3}).status_code == 201
    soon = (datetime.now(UTC) + timedelta(days=2)).isoformat()
    assert create(client, key, document={"cap_runs": 99}, effective_from=soon).status_code == 201
    assert withdraw(client, key, 2, reason="typo").status_code == 200
    assert create(client, key, document={"cap_runs": 4}).status_code == 201
    page = visit(client, sign_in(client, key), "/console/policies").text
    row = re.search(r'<tr data-version="3">(.*?)</tr>', page, re.S)
    assert row is not None
    assert "cap_runs</span>: 3 → 4" in row.group(1)  # not "99 → 4"
    assert "from version 1 (the versions between were withdrawn)" in row.group(1)
    withdrawn = re.search(r'<tr data-version="2">(.*?)</tr>', page, re.S)
    assert withdrawn is not None and "cap_runs</span>: 3 → 99" in withdrawn.group(1)
