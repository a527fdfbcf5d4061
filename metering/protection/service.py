"""The protection report as a use case: admin keys only, always the key's own tenant."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

import psycopg

from metering.billing.rate_store import tenant_rates
from metering.billing.rates import BillingRate, InvoiceFigures
from metering.errors import forbidden
from metering.keys import Principal, Scope
from metering.protection.query import protection_report
from metering.protection.report import CustomerProtection, ProtectionReport
from metering.statements.query import parse_period


def require_admin(principal: Principal) -> None:
    """What protection costs is the platform's margin: admin keys only."""
    if principal.scope is not Scope.ADMIN:
        raise forbidden(
            f"this key has scope {principal.scope.value}; the protection report needs admin"
        )


def report_for(
    conn: psycopg.Connection[Any],
    principal: Principal,
    period: str,
    now: datetime,
    *,
    unit_micros: int,
) -> ProtectionReport:
    """The report of ``period`` (``YYYY-MM`` or ``current``) for the key's tenant, each
    customer's billed and credited also in its billing currency when known
    (``unit_micros``: ``stripe_meter_unit_micros``).

    Raises 403 for a key that is not admin, 422 (``$.period``) for a malformed period.
    """
    require_admin(principal)
    found = protection_report(conn, principal.tenant_id, parse_period(period, now))
    return with_invoice_figures(found, tenant_rates(conn, principal.tenant_id), unit_micros)


def with_invoice_figures(
    found: ProtectionReport, rates: Mapping[str, BillingRate], unit_micros: int
) -> ProtectionReport:
    """The report with each customer's invoice figures at its rate (the total stays USD
    only: customers may be invoiced in different currencies)."""

    def priced(row: CustomerProtection) -> CustomerProtection:
        rate = rates.get(row.customer_id)
        if rate is None:
            return row
        f = row.figures
        return replace(
            row, invoice=InvoiceFigures.of(rate, f.billed_micros, f.credited_micros, unit_micros)
        )

    return replace(
        found,
        customers=tuple(priced(c) for c in found.customers),
        top_by_restored_cost=tuple(priced(c) for c in found.top_by_restored_cost),
    )
