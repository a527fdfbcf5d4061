"""The protection report as a use case: admin keys only, always the key's own tenant."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg

from metering.errors import forbidden
from metering.keys import Principal, Scope
from metering.protection.query import protection_report
from metering.protection.report import ProtectionReport
from metering.statements.query import parse_period


def require_admin(principal: Principal) -> None:
    """What protection costs is the platform's margin: admin keys only."""
    if principal.scope is not Scope.ADMIN:
        raise forbidden(
            f"this key has scope {principal.scope.value}; the protection report needs admin"
        )


def report_for(
    conn: psycopg.Connection[Any], principal: Principal, period: str, now: datetime
) -> ProtectionReport:
    """The report of ``period`` (``YYYY-MM`` or ``current``) for the key's tenant.

    Raises 403 for a key that is not admin, 422 (``$.period``) for a malformed period.
    """
    require_admin(principal)
    return protection_report(conn, principal.tenant_id, parse_period(period, now))
