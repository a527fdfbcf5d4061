"""The IDOR matrix, generated from the served OpenAPI document.

Every operation declares the key scopes it accepts (``security: [{apiKey: [scopes]}]``). For
each one, tenant A holds the target objects (settled, held and refunded runs of a customer and
an open dispute), and the matrix calls the operation with

(a) another tenant's key of each accepted scope      → 404 (collections: 2xx without A's data),
(b) another customer's key where customer keys are accepted → 404 (collections: no A data),
(c) tenant A's key of each scope not accepted        → 403,

never 401, never 5xx, and tenant A's rows are byte-for-byte unchanged afterwards. A control
call with tenant A's own key proves each read target exists, so the 404s are isolation and
not absence. New endpoints are covered automatically; one the matrix cannot call (an unknown
path parameter, body or public endpoint) fails the test, listed.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from litestar.testing import TestClient

from metering.keys import Scope
from tests.helpers.events import auth, usage
from tests.helpers.otlp import one_chat_json
from tests.security.harness import TenantData, seed_tenant

pytestmark = pytest.mark.timeout(120)

ALL_SCOPES = tuple(s.value for s in Scope)
# Operations that take no key, each reviewed: probes, metrics without tenant labels, and the
# Stripe webhook (authenticated by its signature). A new one fails the matrix until listed.
PUBLIC = {
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
    ("POST", "/webhooks/stripe"),
    ("POST", "/webhooks/stripe/thin"),
    # Authenticated by the HMAC token in its path, bound to one customer and period.
    ("GET", "/v1/statement-links/{token}"),
}
# Tables whose rows belong to a tenant: A's must not change while others poke at them.
TENANT_TABLES = (
    "api_keys",
    "audit_log",
    "customers",
    "decisions",
    "disputes",
    "events",
    "ledger_entries",
    "policy_versions",
    "policy_withdrawals",
    "runs",
    "statement_lines",
    "statement_totals",
    "stripe_outbox",
    "webhook_endpoints",
    "webhook_messages",
)


@dataclass(frozen=True)
class Operation:
    method: str
    path: str
    scopes: tuple[str, ...] | None
    params: tuple[str, ...]
    body: str | None  # the component schema name of a JSON body, or the operation's own
    streams: bool = False  # answers Server-Sent Events, which end only after stream_max_s

    @property
    def label(self) -> str:
        return f"{self.method} {self.path}"


def discover(doc: dict[str, Any]) -> list[Operation]:
    found = []
    for path, item in doc["paths"].items():
        for method, spec in item.items():
            if method not in {"get", "post", "put", "patch", "delete"}:
                continue
            security = spec.get("security")
            scopes = tuple(security[0]["apiKey"]) if security else None
            params = tuple(p["name"] for p in spec.get("parameters", []) if p["in"] == "path")
            body = None
            if "requestBody" in spec:
                content = spec["requestBody"]["content"]
                ref = next(iter(content.values()))["schema"].get("$ref", "")
                body = ref.rsplit("/", 1)[-1] or f"{method.upper()} {path}"
            ok = spec.get("responses", {}).get("200", {}).get("content", {})
            streams = "text/event-stream" in ok
            found.append(Operation(method.upper(), path, scopes, params, body, streams))
    return found


def path_values(data: TenantData) -> dict[str, str]:
    return {
        "run": data.runs[0],
        "customer": data.customer,
        "period": datetime.now(UTC).strftime("%Y-%m"),
        "dispute_id": str(data.dispute_id),
        "token": "not-a-link",
        "endpoint_id": data.endpoint_id,
        "message_id": data.message_id,
        "version": str(data.policy_version),
    }


def bodies(data: TenantData) -> dict[str, tuple[str, bytes]]:
    """A valid body per body schema, aimed at tenant A's objects."""

    def as_json(body: Any) -> tuple[str, bytes]:
        return "application/json", json.dumps(body).encode()

    event = usage(run=data.runs[0], customer=data.customer)
    return {
        "DisputeRequest": as_json({"claim": "probe: give me their money"}),
        "CreditRequest": as_json({"full": True, "reason": "probe"}),
        "ReasonRequest": as_json({"reason": "probe"}),
        "StatementLinkRequest": as_json({"period": "current"}),
        "EndpointCreate": as_json({"url": "https://93.184.215.14/probe", "description": "probe"}),
        "EndpointUpdate": as_json({"url": "https://93.184.215.14/probe", "enabled": False}),
        "RedeliverSince": as_json({"since": "2020-01-01T00:00:00Z"}),
        # A version that changes nothing: the probing tenant's settlement stays as it was.
        "PolicyCreate": as_json({"document": {}, "note": "probe"}),
        "PolicyWithdraw": as_json({"reason": "probe"}),
        "WhatIfRequest": as_json({"period": "current", "document": {"rules": {"R4": False}}}),
        "POST /v1/events": ("application/cloudevents+json", json.dumps(event).encode()),
        # Another of A's runs than the CloudEvent's: the prober's own run of that name would
        # have its usage through CloudEvents already, and the refusal names the run it sent.
        "POST /v1/traces": ("application/json", one_chat_json(data.runs[1], data.customer)),
    }


def unknowns(ops: list[Operation], data: TenantData) -> list[str]:
    known_params, known_bodies = path_values(data), bodies(data)
    problems = []
    for op in ops:
        if op.scopes is None and (op.method, op.path) not in PUBLIC:
            problems.append(f"{op.label}: no key scopes declared and not a reviewed public one")
        for name in op.params:
            if name not in known_params:
                problems.append(f"{op.label}: unknown path parameter {{{name}}}")
        if op.scopes is not None and op.body is not None and op.body not in known_bodies:
            problems.append(f"{op.label}: unknown request body {op.body}")
    return problems


def snapshot(db: Any, tenant: str) -> dict[str, str]:
    return {
        table: db.execute(
            f"SELECT md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), '')) "
            f"FROM {table} t WHERE tenant_id = %s",
            (tenant,),
        ).fetchone()[0]
        for table in TENANT_TABLES
    }


@pytest.fixture
def tenant_a(engine, settings, db) -> TenantData:
    # Its own tenant: the policy versions it writes are append-only and outlive the test.
    return seed_tenant(engine, settings, tenant=f"acme-{uuid.uuid4().hex[:10]}")


@pytest.fixture
def document(client) -> dict[str, Any]:
    reply = client.get("/schema/openapi.json")
    assert reply.status_code == 200
    return dict(reply.json())


def test_the_matrix_knows_how_to_call_every_operation(document, tenant_a):
    ops = discover(document)
    assert len(ops) >= 17
    problems = unknowns(ops, tenant_a)
    assert not problems, "the IDOR matrix cannot call:\n" + "\n".join(problems)


def test_no_key_reaches_another_tenants_or_customers_data(
    client, document, make_key, db, tenant_a, settings
):
    a = tenant_a
    # Untargeted writes last: tenant B's ingest of an event naming A's run and customer makes
    # B's own run of that name (run ids are per tenant), which later calls would then find.
    ops = sorted(
        (op for op in discover(document) if op.scopes),
        key=lambda op: not op.params and op.method != "GET",
    )
    assert not unknowns(ops, a)
    params, payloads = path_values(a), bodies(a)
    # Tenant B is a full tenant of its own, with its own customer, so its keys are ordinary.
    # A new one each time: its probe writes a policy version, which no test may inherit.
    tenant_b = f"globex-{uuid.uuid4().hex[:10]}"
    keys_b = {
        s: make_key(
            tenant=tenant_b, scope=s, customer="globex-customer" if s == "customer" else None
        )
        for s in ALL_SCOPES
    }
    keys_a = {
        s: make_key(tenant=a.tenant, scope=s, customer=a.customer if s == "customer" else None)
        for s in ALL_SCOPES
    }
    other_customer = make_key(tenant=a.tenant, scope="customer", customer="acme-other-customer")
    before = snapshot(db, a.tenant)

    def call(op: Operation, key: str, via: Any = client) -> Any:
        url = op.path.format(**{name: params[name] for name in op.params})
        headers = auth(key)
        content = None
        if op.body is not None:
            media_type, content = payloads[op.body]
            headers["content-type"] = media_type
        return via.request(op.method, url, content=content, headers=headers)

    mismatches: list[str] = []

    def expect(op: Operation, who: str, reply: Any, wanted: str) -> None:
        status = reply.status_code
        leaked = [m for m in a.markers if m in reply.text] if status < 300 else []
        ok = {"404": status == 404, "403": status == 403, "2xx, no data": 200 <= status < 300}
        if not ok[wanted] or leaked:
            detail = f" leaked {leaked}" if leaked else ""
            mismatches.append(f"{op.label} as {who}: got {status}, wanted {wanted}{detail}")

    for op in ops:
        assert op.scopes is not None
        targeted = bool(op.params)
        for scope in op.scopes:
            expect(
                op,
                f"tenant B {scope}",
                call(op, keys_b[scope]),
                "404" if targeted else "2xx, no data",
            )
        if "customer" in op.scopes:
            expect(
                op,
                "another customer",
                call(op, other_customer),
                "404" if targeted else "2xx, no data",
            )
        for scope in set(ALL_SCOPES) - set(op.scopes):
            expect(op, f"tenant A {scope} (wrong scope)", call(op, keys_a[scope]), "403")

    assert not mismatches, "\n".join(mismatches)
    assert snapshot(db, a.tenant) == before, "tenant A's rows changed"
    # Control: tenant A's own keys do see every read target, so the 404s above are isolation.
    # A live stream is read from an app whose streams end soon, so its reply is complete.
    from api.app import create_app

    with TestClient(app=create_app(settings.model_copy(update={"stream_max_s": 0.5}))) as short:
        for op in ops:
            if op.method == "GET" and op.params:
                reply = call(op, keys_a[op.scopes[0]], via=short if op.streams else client)
                assert reply.status_code == 200, f"{op.label} control: {reply.status_code}"
                assert any(m in reply.text for m in a.markers), f"{op.label} control: no data"
