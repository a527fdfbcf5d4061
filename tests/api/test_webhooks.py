"""/v1/webhooks over HTTP: who may use it, what is refused (and then nothing written), the
secret shown once, rotation, the delivery log and redelivery."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from litestar.testing import TestClient

from metering.db import raw_transaction
from metering.webhooks.delivery import Attempt, claim, record
from metering.webhooks.fanout import fan_out
from tests.helpers.events import auth, usage
from tests.helpers.ingest import ingest
from tests.helpers.webhooks import notify

PUBLIC_URL = "https://93.184.215.14/hooks"  # a public address literal: no DNS in the tests
ENDPOINTS = "/v1/webhooks/endpoints"


def send(client: Any, method: str, path: str, key: str, body: Any = None) -> Any:
    content = None if body is None else json.dumps(body)
    headers = auth(key, **{"content-type": "application/json"})
    return client.request(method, path, content=content, headers=headers)


def create(client: Any, key: str, **body: Any) -> Any:
    return send(client, "POST", ENDPOINTS, key, {"url": PUBLIC_URL, **body})


@pytest.fixture
def admin(make_key) -> str:
    return str(make_key(scope="admin"))


@pytest.fixture
def endpoint(client, admin) -> dict[str, Any]:
    reply = create(client, admin, description="billing UI", event_types=["run.settled"])
    assert reply.status_code == 201, reply.text
    return dict(reply.json())


def count(db: Any, table: str) -> int:
    return int(db.execute(f"SELECT count(*) FROM {table}").fetchone()[0])


def test_an_admin_creates_an_endpoint_and_sees_its_secret_once(client, admin, db):
    reply = create(client, admin, event_types=["run.settled", "run.held"], description="UI")
    assert reply.status_code == 201, reply.text
    created = reply.json()
    assert created["secret"].startswith("whsec_")
    assert created["id"].startswith("ep_")
    assert created["event_types"] == ["run.settled", "run.held"]
    assert created["enabled"] is True and created["disabled_reason"] is None
    shown = send(client, "GET", f"{ENDPOINTS}/{created['id']}", admin)
    assert shown.status_code == 200
    assert "secret" not in shown.json() and created["secret"] not in shown.text
    listed = send(client, "GET", ENDPOINTS, admin)
    assert [e["id"] for e in listed.json()] == [created["id"]]
    assert created["secret"] not in listed.text
    # Stored as a seed: the secret itself is nowhere in the database.
    stored = db.execute("SELECT row_to_json(e)::text FROM webhook_endpoints e").fetchone()[0]
    assert created["secret"].removeprefix("whsec_") not in stored


@pytest.mark.parametrize("scope", ["ingest", "support", "customer"])
def test_only_admin_keys_may_touch_webhooks(client, make_key, endpoint, scope, db):
    key = make_key(scope=scope, customer="cust-1" if scope == "customer" else None)
    ep = f"{ENDPOINTS}/{endpoint['id']}"
    calls = [
        ("POST", ENDPOINTS, {"url": PUBLIC_URL}),
        ("GET", ENDPOINTS, None),
        ("GET", ep, None),
        ("PATCH", ep, {"enabled": False}),
        ("DELETE", ep, None),
        ("POST", f"{ep}/rotate-secret", None),
        ("GET", f"{ep}/deliveries", None),
        ("POST", f"{ep}/redeliver", {"since": "2026-01-01T00:00:00Z"}),
        ("POST", "/v1/webhooks/messages/msg_0/redeliver", None),
    ]
    for method, path, body in calls:
        reply = send(client, method, path, key, body)
        assert reply.status_code == 403, f"{method} {path}: {reply.status_code}"
        assert reply.json()["code"] == "forbidden"
    assert count(db, "webhook_endpoints") == 1


def test_another_tenants_endpoint_is_not_found(client, make_key, endpoint, db):
    other = make_key(tenant="globex", scope="admin")
    ep = f"{ENDPOINTS}/{endpoint['id']}"
    for method, path, body in [
        ("GET", ep, None),
        ("PATCH", ep, {"url": "https://93.184.215.15/x"}),
        ("DELETE", ep, None),
        ("POST", f"{ep}/rotate-secret", None),
        ("GET", f"{ep}/deliveries", None),
        ("POST", f"{ep}/redeliver", {"since": "2026-01-01T00:00:00Z"}),
    ]:
        reply = send(client, method, path, other, body)
        assert reply.status_code == 404, f"{method} {path}: {reply.status_code}"
        assert reply.json()["code"] == "endpoint_not_found"
    assert send(client, "GET", ENDPOINTS, other).json() == []
    row = db.execute("SELECT url, enabled FROM webhook_endpoints").fetchone()
    assert row == (PUBLIC_URL, True)


@pytest.mark.parametrize(
    ("body", "path", "code"),
    [
        ({"url": "not a url"}, "$.url", "invalid_url"),
        ({"url": "http://93.184.215.14/x"}, "$.url", "url_not_https"),
        ({"url": "https://127.0.0.1/x"}, "$.url", "url_target_forbidden"),
        ({"url": "https://169.254.169.254/latest"}, "$.url", "url_target_forbidden"),
        ({"url": "https://[::1]:8443/"}, "$.url", "url_target_forbidden"),
        ({"url": "https://localhost/x"}, "$.url", "url_target_forbidden"),
        (
            {"url": PUBLIC_URL, "event_types": ["run.settled", "run.exploded"]},
            "$.event_types[1]",
            "unknown_event_type",
        ),
        ({"url": PUBLIC_URL, "description": "x" * 501}, "$.description", "invalid_value"),
    ],
)
def test_bad_input_is_a_422_naming_the_field_and_writes_nothing(
    client, admin, db, body, path, code
):
    reply = send(client, "POST", ENDPOINTS, admin, body)
    assert reply.status_code == 422, reply.text
    problem = reply.json()
    assert problem["code"] == code
    assert [e["path"] for e in problem["errors"]] == [path]
    assert count(db, "webhook_endpoints") == 0


def test_a_malformed_body_is_a_400(client, admin, db):
    for body in ({"url": 7}, {"url": PUBLIC_URL, "secret": "mine"}, {"event_types": []}):
        reply = send(client, "POST", ENDPOINTS, admin, body)
        assert reply.status_code == 400, reply.text
    assert count(db, "webhook_endpoints") == 0


def test_private_targets_and_http_are_allowed_when_the_setting_says_so(settings, db, make_key):
    from api.app import create_app

    admin = make_key(scope="admin")
    allowed = settings.model_copy(update={"webhooks_allow_private": True})
    with TestClient(app=create_app(allowed)) as client:
        reply = send(client, "POST", ENDPOINTS, admin, {"url": "http://127.0.0.1:9/hooks"})
    assert reply.status_code == 201, reply.text


def test_a_change_is_checked_like_a_creation(client, admin, endpoint, db):
    ep = f"{ENDPOINTS}/{endpoint['id']}"
    reply = send(client, "PATCH", ep, admin, {"url": "https://10.0.0.8/x", "event_types": ["x"]})
    assert reply.status_code == 422
    assert {e["path"] for e in reply.json()["errors"]} == {"$.url", "$.event_types[0]"}
    reply = send(client, "PATCH", ep, admin, {"description": "new words", "event_types": []})
    assert reply.status_code == 200, reply.text
    changed = reply.json()
    assert changed["description"] == "new words" and changed["event_types"] == []
    assert changed["url"] == PUBLIC_URL


def test_disabling_records_who_and_enabling_clears_it(client, admin, endpoint):
    ep = f"{ENDPOINTS}/{endpoint['id']}"
    off = send(client, "PATCH", ep, admin, {"enabled": False}).json()
    assert off["enabled"] is False
    assert off["disabled_reason"].startswith("disabled by key ")
    assert off["disabled_at"] is not None
    on = send(client, "PATCH", ep, admin, {"enabled": True}).json()
    assert (on["enabled"], on["disabled_reason"], on["disabled_at"]) == (True, None, None)


def test_rotation_shows_the_new_secret_once_and_keeps_the_old_for_24_hours(client, admin, endpoint):
    ep = f"{ENDPOINTS}/{endpoint['id']}"
    reply = send(client, "POST", f"{ep}/rotate-secret", admin)
    assert reply.status_code == 200, reply.text
    rotated = reply.json()
    assert rotated["secret"].startswith("whsec_") and rotated["secret"] != endpoint["secret"]
    until = datetime.fromisoformat(rotated["previous_secret_expires_at"])
    assert abs(until - (datetime.now(UTC) + timedelta(hours=24))) < timedelta(minutes=1)
    shown = send(client, "GET", ep, admin)
    assert rotated["secret"] not in shown.text
    assert shown.json()["previous_secret_expires_at"] == rotated["previous_secret_expires_at"]


def test_deleting_an_endpoint_removes_it_and_its_log(client, admin, endpoint, engine, settings, db):
    _deliveries(engine, settings, 2)
    ep = f"{ENDPOINTS}/{endpoint['id']}"
    assert send(client, "DELETE", ep, admin).status_code == 204
    assert send(client, "GET", ep, admin).status_code == 404
    assert count(db, "webhook_messages") == 0 and count(db, "webhook_attempts") == 0


def _deliveries(engine: Any, settings: Any, runs: int) -> None:
    """``runs`` settled notifications fanned out, each tried once and answered 500."""
    ingest(engine, settings, [usage(run=f"run-{i}", customer="cust-1") for i in range(runs)])
    for i in range(runs):
        notify(engine, "run.settled", run=f"run-{i}", outcome="billed")
    now = datetime.now(UTC)
    with raw_transaction(engine) as conn:
        fan_out(conn, settings, now)
    with raw_transaction(engine) as conn:
        claimed = claim(conn, now, 100, timedelta(seconds=30))
    for message in claimed:
        with raw_transaction(engine) as conn:
            record(conn, message, Attempt(now, False, 500, 12, "boom" * 200, None), settings)


@pytest.fixture
def logged(client, admin, endpoint, engine, settings) -> Iterator[dict[str, Any]]:
    _deliveries(engine, settings, 5)
    yield endpoint


def test_the_delivery_log_pages_newest_first_with_every_attempt(client, admin, logged):
    path = f"{ENDPOINTS}/{logged['id']}/deliveries"
    first = send(client, "GET", f"{path}?limit=3", admin).json()
    assert [d["run"] for d in first["deliveries"]] == ["run-4", "run-3", "run-2"]
    delivery = first["deliveries"][0]
    assert delivery["message_id"].startswith("msg_")
    assert (delivery["type"], delivery["status"], delivery["attempt_count"]) == (
        "run.settled",
        "pending",
        1,
    )
    assert delivery["next_attempt_at"] is not None
    [attempt] = delivery["attempts"]
    assert (attempt["attempt"], attempt["status_code"], attempt["latency_ms"]) == (1, 500, 12)
    assert attempt["outcome"] == "failed" and len(attempt["response_excerpt"]) == 500
    rest = send(client, "GET", f"{path}?limit=3&cursor={first['next_cursor']}", admin).json()
    assert [d["run"] for d in rest["deliveries"]] == ["run-1", "run-0"]
    assert rest["next_cursor"] is None
    assert send(client, "GET", f"{path}?status=delivered", admin).json()["deliveries"] == []
    bad = send(client, "GET", f"{path}?cursor=bm9wZQ", admin)
    assert bad.status_code == 422 and bad.json()["code"] == "invalid_cursor"
    bad = send(client, "GET", f"{path}?status=lost", admin)
    assert bad.status_code == 422 and bad.json()["errors"][0]["path"] == "$.status"


def test_redelivering_a_message_requeues_it_now_with_the_same_id(client, admin, logged, db):
    path = f"{ENDPOINTS}/{logged['id']}/deliveries"
    message = send(client, "GET", path, admin).json()["deliveries"][0]
    db.execute("UPDATE webhook_messages SET status = 'failed', finished_at = now()")
    reply = send(client, "POST", f"/v1/webhooks/messages/{message['message_id']}/redeliver", admin)
    assert reply.status_code == 202, reply.text
    assert reply.json()["message_id"] == message["message_id"]
    assert reply.json()["status"] == "pending"
    row = db.execute(
        "SELECT status, tries, next_attempt_at <= now() FROM webhook_messages WHERE msg_id = %s",
        (message["message_id"],),
    ).fetchone()
    assert row == ("pending", 0, True)
    assert (
        db.execute("SELECT count(*) FROM webhook_messages WHERE status = 'failed'").fetchone()[0]
        == 4
    )


def test_redelivering_since_a_time_requeues_the_messages_made_since(client, admin, logged, db):
    db.execute("UPDATE webhook_messages SET status = 'delivered', finished_at = now()")
    db.execute(
        "UPDATE webhook_messages SET created_at = now() - interval '2 hours' "
        "WHERE subject IN ('run-0', 'run-1')"
    )
    since = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    reply = send(client, "POST", f"{ENDPOINTS}/{logged['id']}/redeliver", admin, {"since": since})
    assert reply.status_code == 202, reply.text
    assert reply.json() == {"requeued": 3}
    pending = db.execute(
        "SELECT subject FROM webhook_messages WHERE status = 'pending' ORDER BY subject"
    ).fetchall()
    assert [p[0] for p in pending] == ["run-2", "run-3", "run-4"]
    naive = send(
        client,
        "POST",
        f"{ENDPOINTS}/{logged['id']}/redeliver",
        admin,
        {"since": "2026-01-01T00:00:00"},
    )
    assert naive.status_code == 422 and naive.json()["errors"][0]["path"] == "$.since"


def test_redelivery_to_a_disabled_endpoint_is_a_conflict(client, admin, logged):
    ep = f"{ENDPOINTS}/{logged['id']}"
    send(client, "PATCH", ep, admin, {"enabled": False})
    reply = send(client, "POST", f"{ep}/redeliver", admin, {"since": "2026-01-01T00:00:00Z"})
    assert reply.status_code == 409 and reply.json()["code"] == "endpoint_disabled"


def test_another_tenants_message_is_not_found(client, make_key, logged, admin):
    message = send(client, "GET", f"{ENDPOINTS}/{logged['id']}/deliveries", admin).json()
    msg_id = message["deliveries"][0]["message_id"]
    other = make_key(tenant="globex", scope="admin")
    reply = send(client, "POST", f"/v1/webhooks/messages/{msg_id}/redeliver", other)
    assert reply.status_code == 404 and reply.json()["code"] == "message_not_found"


def test_options_names_every_method_of_a_shared_path(client):
    for path, allowed in [
        (ENDPOINTS, "GET, OPTIONS, POST"),
        (f"{ENDPOINTS}/ep_x", "DELETE, GET, OPTIONS, PATCH"),
        (f"{ENDPOINTS}/ep_x/rotate-secret", "OPTIONS, POST"),
    ]:
        reply = client.options(path)
        assert reply.status_code == 204
        assert reply.headers["allow"] == allowed


def test_a_dispute_opened_through_the_support_api_becomes_a_message(
    client, admin, make_key, engine, settings, db
):
    from metering.settlement.runner import settle_due_now
    from tests.helpers.scenarios import scenario

    start = datetime.now(UTC) - timedelta(hours=3)
    ingest(engine, settings, scenario("completed", "ok-run", "cust-1", start))
    settle_due_now(engine, settings, now=datetime.now(UTC))
    created = create(client, admin, event_types=["dispute.opened"]).json()
    reply = send(
        client,
        "POST",
        "/v1/support/runs/ok-run/disputes",
        make_key(scope="support"),
        {"claim": "it crashed"},
    )
    assert reply.status_code == 201, reply.text
    with raw_transaction(engine) as conn:
        fan_out(conn, settings, datetime.now(UTC))
    [payload] = [
        json.loads(p[0])
        for p in db.execute(
            "SELECT payload FROM webhook_messages WHERE endpoint_id = %s", (created["id"],)
        ).fetchall()
    ]
    assert payload["type"] == "dispute.opened"
    assert payload["data"]["run"]["run"] == "ok-run"


def test_the_cli_manages_endpoints_and_redelivers(client, admin, engine, settings, db):
    import subprocess
    import sys

    from tests.helpers import ROOT
    from tests.helpers.processes import service_env

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "cli", "webhooks", *args],
            cwd=ROOT,
            env=service_env(settings),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    refused = cli("endpoints", "create", "--tenant", "acme", "--url", "https://10.0.0.1/")
    assert refused.returncode != 0 and "private address" in refused.stderr
    made = cli(
        "endpoints", "create", "--tenant", "acme", "--url", PUBLIC_URL, "--type", "run.settled"
    )
    assert made.returncode == 0, made.stderr
    secret = made.stdout.strip()
    endpoint_id = made.stderr.split("endpoint id: ")[1].split()[0]
    assert secret.startswith("whsec_")
    listed = cli("endpoints", "list", "--tenant", "acme")
    assert f"{endpoint_id}\tenabled\trun.settled\t{PUBLIC_URL}" in listed.stdout
    assert secret not in listed.stdout
    rotated = cli("endpoints", "rotate", endpoint_id, "--tenant", "acme")
    assert rotated.returncode == 0 and rotated.stdout.strip() not in ("", secret)
    _deliveries(engine, settings, 2)
    shown = cli("deliveries", endpoint_id, "--tenant", "acme")
    assert shown.stdout.count("run.settled") == 2 and "\t500\t" in shown.stdout
    msg_id = shown.stdout.split()[0]
    assert cli("redeliver", "--tenant", "acme", "--message", msg_id).stdout == (
        f"requeued {msg_id}\n"
    )
    since = cli("redeliver", "--tenant", "acme", "--endpoint", endpoint_id, "--since", "2020-01-01")
    assert since.stdout == "requeued 2 message(s)\n", since.stderr
    off = cli("endpoints", "disable", endpoint_id, "--tenant", "acme")
    assert "disabled (disabled by key cli)" in off.stdout
    other = cli("endpoints", "disable", endpoint_id, "--tenant", "globex")
    assert other.returncode != 0 and "endpoint_not_found" in other.stderr
