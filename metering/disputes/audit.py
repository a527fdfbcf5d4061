"""The audit log: one append-only row per support action, in the action's transaction."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from metering.keys import Principal


def record(
    conn: psycopg.Connection[Any],
    principal: Principal,
    *,
    action: str,
    target_type: str,
    target_id: str,
    reason: str | None,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
) -> None:
    conn.execute(
        "INSERT INTO audit_log (tenant_id, actor, actor_scope, action, target_type, target_id, "
        "reason, before, after) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
        (
            principal.tenant_id,
            principal.key_id,
            principal.scope.value,
            action,
            target_type,
            target_id,
            reason,
            Jsonb(before) if before is not None else None,
            Jsonb(after) if after is not None else None,
        ),
    )


@dataclass(frozen=True, slots=True)
class AuditEntry:
    id: int
    actor: str
    actor_scope: str
    action: str
    target_type: str
    target_id: str
    reason: str | None
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    created_at: datetime


def entries(
    conn: psycopg.Connection[Any], tenant_id: str, *, target_id: str | None = None, limit: int = 200
) -> list[AuditEntry]:
    rows = conn.execute(
        "SELECT id, actor, actor_scope, action, target_type, target_id, reason, before, after, "
        "created_at FROM audit_log WHERE tenant_id = %s "
        "AND (%s::text IS NULL OR target_id = %s) ORDER BY id DESC LIMIT %s",
        (tenant_id, target_id, target_id, limit),
    ).fetchall()
    return [AuditEntry(*r) for r in rows]
