"""Withdraw a policy version before it takes effect: the undo for a mistyped schedule.

Versions are append-only, so a withdrawal never edits one: it is its own append-only row
(``policy_withdrawals``: who, when, why), and every reader that decides which version is in
force leaves withdrawn versions out (``versions.list_versions``, ``versions.load_book``). Only
a version that has not taken effect can be withdrawn: one that has may have decided runs,
and decisions name the version that made them.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any

import psycopg

from metering.errors import FieldError, conflict, validation_error
from metering.policies.versions import PolicyVersion, Withdrawal, get_version, lock_policy
from metering.policy.document import PolicyDocument

MAX_REASON_CHARS = 2_000


def withdraw_version(
    conn: psycopg.Connection[Any],
    tenant_id: str,
    version: int,
    *,
    withdrawn_by: str,
    defaults: PolicyDocument,
    reason: str = "",
    wait_s: float = 5.0,
) -> PolicyVersion:
    """Withdraw the tenant's ``version``, which then is never in force; the version with it.

    Idempotent: a version already withdrawn is returned as it was withdrawn (the first
    withdrawal's who, when and why), whatever this call's reason. 404 for a version the
    tenant does not have; 409 ``policy_version_in_force`` for one that has taken effect
    (version 0, the settings, always has). Under the tenant's policy lock, with the clock
    read after it, so no concurrent write or withdrawal sees it half done.
    """
    if len(reason) > MAX_REASON_CHARS or "\x00" in reason:
        message = f"at most {MAX_REASON_CHARS} characters"
        raise validation_error([FieldError("$.reason", "invalid_reason", message)])
    now = lock_policy(conn, tenant_id, wait_s)
    found = get_version(conn, tenant_id, version, defaults)
    if found.withdrawn is not None:
        return found
    if found.effective_from is None or found.effective_from <= now:
        raise conflict(
            f"version {version} has taken effect"
            + (f" (at {found.effective_from.isoformat()})" if found.effective_from else "")
            + ": only a version that has not can be withdrawn; write a new version instead",
            code="policy_version_in_force",
            version=version,
        )
    return replace(found, withdrawn=_record(conn, tenant_id, version, withdrawn_by, reason, now))


def _record(
    conn: psycopg.Connection[Any],
    tenant_id: str,
    version: int,
    withdrawn_by: str,
    reason: str,
    now: datetime,
) -> Withdrawal:
    row = conn.execute(
        "INSERT INTO policy_withdrawals (tenant_id, version, withdrawn_at, withdrawn_by, reason) "
        "VALUES (%s, %s, %s, %s, %s) RETURNING withdrawn_at, withdrawn_by, reason",
        (tenant_id, version, now, withdrawn_by, reason),
    ).fetchone()
    assert row is not None
    return Withdrawal(*row)
