"""What the security tests share (no fixtures): API processes with their own settings and
logs, the app in-process with settings changed, and a tenant seeded with data to protect."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from litestar.testing import TestClient

from metering.config import Settings
from tests.helpers import ROOT
from tests.helpers.processes import free_port, service_env, wait_http

SERVE = (sys.executable, "-m", "cli", "serve")


@dataclass
class Served:
    """An API process: its base URL and the files its stdout and stderr go to."""

    base: str
    stdout: Path
    stderr: Path
    process: subprocess.Popen[bytes] | None = None

    def logs(self) -> str:
        return self.stdout.read_text(errors="replace") + self.stderr.read_text(errors="replace")


@contextmanager
def serve(
    settings: Settings,
    tmp_path: Path,
    *,
    workers: int = 1,
    command: tuple[str, ...] = SERVE,
    **env: str,
) -> Iterator[Served]:
    """``fairmeter serve`` (or ``command``) in its own process, as deployed, with extra
    ``FAIRMETER_*`` or standard variables; stopped (killed if it must be) when the block ends."""
    port = free_port()
    name = uuid.uuid4().hex[:8]
    out, err = tmp_path / f"api-{name}.out", tmp_path / f"api-{name}.err"
    environment = {**service_env(settings), **env}
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(
            [*command, "--port", str(port), "--workers", str(workers)],
            cwd=ROOT,
            env=environment,
            stdout=stdout,
            stderr=stderr,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            wait_http(f"{base}/healthz", deadline_s=120)  # ~30 s to start on a loaded host
            yield Served(base, out, err, proc)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


@contextmanager
def client_with(settings: Settings, **overrides: Any) -> Iterator[TestClient[Any]]:
    """The real app in-process with some settings changed."""
    from api.app import create_app

    with TestClient(app=create_app(settings.model_copy(update=overrides))) as client:
        yield client


def unique_prefix() -> str:
    """A Redis key prefix of one test, so its small limits count only its own requests."""
    return f"fairmeter-test:ratelimit:{uuid.uuid4().hex}"


@dataclass(frozen=True)
class TenantData:
    """What :func:`seed_tenant` stored: one customer's settled, held and refunded runs, an
    open dispute and a webhook endpoint with a message about the first run, plus the strings
    that must never show up in another tenant's replies."""

    tenant: str
    customer: str
    runs: tuple[str, ...]
    dispute_id: int
    claim: str
    endpoint_id: str
    endpoint_description: str
    message_id: str
    policy_version: int
    policy_note: str

    @property
    def markers(self) -> tuple[str, ...]:
        return (self.customer, *self.runs, self.claim, self.endpoint_description, self.policy_note)


def seed_tenant(engine: Any, settings: Settings, *, tenant: str = "acme") -> TenantData:
    """Settled runs of each kind and an open dispute in ``tenant``, through the use cases."""
    from datetime import UTC, datetime, timedelta

    from metering.db import raw_transaction
    from metering.disputes import service
    from metering.keys import Principal, Scope
    from metering.settlement.runner import settle_due_now
    from tests.helpers.ingest import ingest
    from tests.helpers.scenarios import scenario

    now = datetime.now(UTC)
    start = now - timedelta(hours=3)
    customer = f"{tenant}-secret-customer"
    runs = (f"{tenant}-ok-run", f"{tenant}-held-run", f"{tenant}-drop-run")
    events = (
        scenario("completed", runs[0], customer, start)
        + scenario("client-claim", runs[1], customer, start)
        + scenario("server-drop", runs[2], customer, start)
    )
    ingest(engine, settings, events, tenant=tenant)
    settle_due_now(engine, settings, now=now)
    claim = f"{tenant} claim: the agent crashed"
    with raw_transaction(engine) as conn:
        support = Principal(tenant, Scope.SUPPORT, "seed")
        dispute_id = service.open_dispute(conn, support, runs[0], claim)
    endpoint_id, description, message_id = seed_webhook(engine, settings, tenant, runs[0])
    policy_version, policy_note = seed_policy(engine, settings, tenant)
    return TenantData(
        tenant,
        customer,
        runs,
        dispute_id,
        claim,
        endpoint_id,
        description,
        message_id,
        policy_version,
        policy_note,
    )


def seed_policy(engine: Any, settings: Settings, tenant: str) -> tuple[int, str]:
    """A policy version of ``tenant`` that changes nothing but carries a secret note: (its
    number, the note). Versions are append-only, so a tenant seeded twice has more."""
    from datetime import UTC, datetime

    from metering.db import raw_transaction
    from metering.policies.defaults import settings_policy
    from metering.policies.versions import create_version

    note = f"{tenant} secret policy note"
    with raw_transaction(engine) as conn:
        made = create_version(
            conn,
            tenant,
            {},
            created_by="seed",
            now=datetime.now(UTC),
            defaults=settings_policy(settings),
            note=note,
        )
    return made.version, note


def seed_webhook(engine: Any, settings: Settings, tenant: str, run: str) -> tuple[str, str, str]:
    """A webhook endpoint of ``tenant`` and one message to it about ``run``: (endpoint id,
    its description, the message's id)."""
    from datetime import UTC, datetime

    from metering.db import raw_transaction
    from metering.keys import Principal, Scope
    from metering.webhooks.endpoints import EndpointSpec, create_endpoint
    from metering.webhooks.fanout import fan_out
    from tests.helpers.webhooks import notify

    description = f"{tenant} secret webhook"
    admin = Principal(tenant, Scope.ADMIN, "seed")
    with raw_transaction(engine) as conn:
        spec = EndpointSpec("https://93.184.215.14/hooks", description=description)
        endpoint, _ = create_endpoint(conn, admin, spec, settings)
        customer = conn.execute(
            "SELECT customer_id FROM runs WHERE tenant_id = %s AND subject = %s", (tenant, run)
        ).fetchone()[0]
    notify(engine, "run.settled", tenant=tenant, customer_id=customer, run=run)
    with raw_transaction(engine) as conn:
        fan_out(conn, settings, datetime.now(UTC))
        (message_id,) = conn.execute(
            "SELECT msg_id FROM webhook_messages WHERE endpoint_id = %s", (endpoint.id,)
        ).fetchone()
    return endpoint.id, description, message_id
