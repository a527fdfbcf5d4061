"""/v1/policies: an admin writes, lists, reads and diffs the tenant's policy versions."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.helpers.events import auth

JSON = {"content-type": "application/json"}


@pytest.fixture
def admin(make_key) -> str:
    # Policy versions are append-only and outlive a test: each test has its own tenant.
    return str(make_key(tenant=f"pol-{uuid.uuid4().hex[:12]}", scope="admin"))


def create(client: Any, key: str, **body: Any) -> Any:
    return client.post("/v1/policies", content=json.dumps(body), headers=auth(key, **JSON))


def test_an_admin_writes_a_version_that_keeps_what_it_leaves_out(client, admin):
    reply = create(
        client,
        admin,
        document={"cap_runs": 5, "rules": {"R7": {"action": "auto_refund", "under_micros": 5000}}},
        note="small unverified failures are refunded",
    )
    assert reply.status_code == 201, reply.text
    made = reply.json()
    assert (made["version"], made["in_force"], made["note"]) == (
        1,
        True,
        "small unverified failures are refunded",
    )
    assert made["document"]["cap_runs"] == 5
    assert made["document"]["cap_floor_micros"] == 5_000_000  # the settings' value
    assert made["document"]["rules"]["R4"] is True
    second = create(client, admin, document={"rules": {"R4": False}}).json()
    assert second["version"] == 2
    assert second["document"]["cap_runs"] == 5  # kept from version 1
    assert second["document"]["rules"]["R7"]["under_micros"] == 5000
    listed = client.get("/v1/policies", headers=auth(admin)).json()
    assert [(p["version"], p["in_force"]) for p in listed] == [(0, False), (1, False), (2, True)]
    assert client.get("/v1/policies/1", headers=auth(admin)).json() == {
        **made,
        "in_force": False,
    }
    default = client.get("/v1/policies/0", headers=auth(admin)).json()
    assert (default["effective_from"], default["document"]["cap_runs"]) == (None, 20)


def test_a_version_may_take_effect_later_but_never_earlier(client, admin):
    tomorrow = datetime.now(UTC) + timedelta(days=1)
    later = tomorrow.isoformat()
    reply = create(client, admin, document={}, effective_from=later)
    assert reply.status_code == 201, reply.text
    assert reply.json()["in_force"] is False
    listed = client.get("/v1/policies", headers=auth(admin)).json()
    assert [p["in_force"] for p in listed] == [True, False]
    # Not in the past, and not before the latest version's start (it would shadow it).
    for moment in ((datetime.now(UTC) - timedelta(hours=1)), tomorrow - timedelta(hours=1)):
        refused = create(client, admin, document={}, effective_from=moment.isoformat())
        assert refused.status_code == 422, refused.text
        assert [e["path"] for e in refused.json()["errors"]] == ["$.effective_from"]
    naive = create(client, admin, document={}, effective_from="2030-01-01T00:00:00")
    assert naive.status_code == 422
    assert naive.json()["errors"][0]["code"] == "invalid_time"


def test_a_bad_document_is_refused_with_every_field_path(client, admin):
    reply = create(
        client,
        admin,
        document={
            "cap_fraction_ppm": 2_000_000,
            "rules": {"R7": {"action": "auto_refund"}, "R9": True},
        },
    )
    assert reply.status_code == 422, reply.text
    problem = reply.json()
    assert problem["code"] == "invalid_policy"
    assert {e["path"] for e in problem["errors"]} == {
        "$.document.cap_fraction_ppm",
        "$.document.rules.R7.under_micros",
        "$.document.rules.R9",
    }
    assert client.get("/v1/policies", headers=auth(admin)).json()[-1]["version"] == 0


@pytest.mark.parametrize(
    "body", [{"document": [1]}, {"document": {"cap_runs": True}}, {"document": {}, "x": 1}, {}]
)
def test_malformed_requests_are_4xx(client, admin, body):
    reply = create(client, admin, **body)
    assert 400 <= reply.status_code < 500, reply.text


def test_a_diff_names_each_changed_field(client, admin):
    create(client, admin, document={"cap_runs": 5})
    create(client, admin, document={"cap_runs": 6, "rules": {"R1": False}})
    latest = client.get("/v1/policies/diff", headers=auth(admin)).json()
    assert latest == {
        "from_version": 1,
        "to_version": 2,
        "changes": [
            {"path": "cap_runs", "old": 5, "new": 6},
            {"path": "rules.R1", "old": True, "new": False},
        ],
    }
    from_default = client.get("/v1/policies/diff?from=0&to=1", headers=auth(admin)).json()
    assert from_default["changes"] == [{"path": "cap_runs", "old": 20, "new": 5}]


@pytest.mark.parametrize(
    "path",
    ["/v1/policies/3", "/v1/policies/99999999999", "/v1/policies/diff?from=0&to=3"],
)
def test_unknown_versions_are_404(client, admin, path):
    reply = client.get(path, headers=auth(admin))
    assert reply.status_code == 404, reply.text
    assert reply.json()["code"] == "policy_version_not_found"


def test_only_admin_keys_reach_policies(client, make_key):
    tenant = f"pol-{uuid.uuid4().hex[:12]}"
    for scope in ("ingest", "support"):
        key = make_key(tenant=tenant, scope=scope)
        assert client.get("/v1/policies", headers=auth(key)).status_code == 403
        assert create(client, key, document={}).status_code == 403


def test_what_if_prices_a_candidate_and_writes_nothing(client, make_key, engine, settings, db):
    from metering.settlement.runner import settle_due_now
    from tests.helpers.ingest import ingest
    from tests.helpers.scenarios import scenario

    tenant = f"pol-{uuid.uuid4().hex[:12]}"
    start = datetime.now(UTC) - timedelta(minutes=30)
    events = scenario("server-drop", "drop", "cust-1", start)
    events += scenario("completed", "ok", "cust-2", start)
    ingest(engine, settings, events, tenant=tenant)
    settle_due_now(engine, settings, now=datetime.now(UTC))
    key = make_key(tenant=tenant, scope="admin")
    period = f"{start + timedelta(minutes=4):%Y-%m}"  # the runs' end's month
    before = db.execute("SELECT count(*) FROM decisions").fetchone()
    reply = client.post(
        "/v1/policy/what-if",
        content=json.dumps({"period": period, "document": {"rules": {"R4": False}}}),
        headers=auth(key, **JSON),
    )
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert (body["runs"], body["checked"], body["reproduced"]) == (2, 2, 2)
    assert body["not_reproduced_examples"] == []
    assert body["candidate"]["rules"]["R4"] is False
    assert body["changes"] == [
        {"old_outcome": "refunded", "new_outcome": "confirmed", "runs": 1, "example_runs": ["drop"]}
    ]
    total = body["total"]
    assert total["candidate"]["credited_micros"] == 0 < total["current"]["credited_micros"]
    assert [c["customer"] for c in body["customers"]] == ["cust-1", "cust-2"]
    assert db.execute("SELECT count(*) FROM decisions").fetchone() == before
    for bad, path in (
        ({"period": "2026-13"}, "$.period"),
        ({"period": "current", "document": {"cap_runs": -1}}, "$.document.cap_runs"),
    ):
        refused = client.post(
            "/v1/policy/what-if", content=json.dumps(bad), headers=auth(key, **JSON)
        )
        assert refused.status_code == 422, refused.text
        assert refused.json()["errors"][0]["path"] == path


def test_the_console_shows_an_admin_the_versions_and_what_each_changed(client, make_key):
    from tests.security.test_console_sessions import sign_in, visit

    tenant = f"pol-{uuid.uuid4().hex[:12]}"
    admin_key = make_key(tenant=tenant, scope="admin")
    create(client, admin_key, document={"rules": {"R4": False}}, note="no refunds <b>pilot</b>")
    later = (datetime.now(UTC) + timedelta(days=3)).isoformat()
    create(client, admin_key, document={"cap_runs": 3}, effective_from=later)
    page = visit(client, sign_in(client, admin_key), "/console/policies")
    assert page.status_code == 200, page.text
    text = page.text
    assert 'id="nav-policies"' in text
    assert "no refunds &lt;b&gt;pilot&lt;/b&gt;" in text  # escaped, as every operator text
    assert 'data-state="in force"' in text and 'data-state="scheduled"' in text
    assert 'data-state="superseded"' in text  # version 0
    assert "rules.R4</span>: true → false" in text
    assert "In force: version 1" in text
    support = make_key(tenant=tenant, scope="support")
    support_page = visit(client, sign_in(client, support), "/console/policies")
    assert support_page.status_code == 403
    assert "no refunds" not in support_page.text
    other = make_key(tenant=f"pol-{uuid.uuid4().hex[:12]}", scope="admin")
    assert "no refunds" not in visit(client, sign_in(client, other), "/console/policies").text
