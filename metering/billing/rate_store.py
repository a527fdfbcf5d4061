"""The customers' billing rates (``rates.BillingRate``) in the database: the latest wins."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import psycopg

from metering.billing.rates import BillingRate, InvoiceFigures


def store_for_stripe_customer(
    conn: psycopg.Connection[Any], stripe_customer: str, rate: BillingRate
) -> int:
    """Store ``rate`` on every customer linked to ``stripe_customer`` unless a rate learned
    later is there already (latest wins); the number of customers changed."""
    result = conn.execute(
        f"UPDATE customers SET {_SET} WHERE stripe_customer_id = %(stripe)s AND {_NEWER}",
        _params(rate) | {"stripe": stripe_customer},
    )
    return result.rowcount


def store(conn: psycopg.Connection[Any], tenant: str, customer: str, rate: BillingRate) -> None:
    """Store ``rate`` on one customer (latest wins, as above)."""
    conn.execute(
        f"UPDATE customers SET {_SET} WHERE tenant_id = %(t)s AND id = %(c)s AND {_NEWER}",
        _params(rate) | {"t": tenant, "c": customer},
    )


def rate_for(conn: psycopg.Connection[Any], tenant: str, customer: str) -> BillingRate | None:
    """The customer's stored rate; None while its currency is not known."""
    row = conn.execute(
        "SELECT billing_currency, billing_unit_amount_decimal, billing_rate_since "
        "FROM customers WHERE tenant_id = %s AND id = %s AND billing_currency IS NOT NULL",
        (tenant, customer),
    ).fetchone()
    return None if row is None else BillingRate(str(row[0]), Decimal(row[1]), row[2])


def tenant_rates(conn: psycopg.Connection[Any], tenant: str) -> dict[str, BillingRate]:
    """The stored rate of each of the tenant's customers whose currency is known."""
    rows = conn.execute(
        "SELECT id, billing_currency, billing_unit_amount_decimal, billing_rate_since "
        "FROM customers WHERE tenant_id = %s AND billing_currency IS NOT NULL",
        (tenant,),
    ).fetchall()
    return {str(r[0]): BillingRate(str(r[1]), Decimal(r[2]), r[3]) for r in rows}


_SET = (
    "billing_currency = %(currency)s, billing_unit_amount_decimal = %(amount)s, "
    "billing_rate_since = %(since)s"
)
_NEWER = "(billing_rate_since IS NULL OR billing_rate_since <= %(since)s)"


def _params(rate: BillingRate) -> dict[str, Any]:
    return {"currency": rate.currency, "amount": rate.unit_amount_minor, "since": rate.since}


def invoice_figures(
    conn: psycopg.Connection[Any],
    tenant: str,
    customer: str,
    *,
    billed_micros: int,
    credited_micros: int,
    unit_micros: int,
) -> InvoiceFigures | None:
    """The customer's billed and credited micros at its stored rate; None while unknown."""
    rate = rate_for(conn, tenant, customer)
    if rate is None:
        return None
    return InvoiceFigures.of(rate, billed_micros, credited_micros, unit_micros)
