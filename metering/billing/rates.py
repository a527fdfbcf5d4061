"""A customer's billing rate: the currency of its invoices and the price of one meter unit in
it — the only conversion between the micro-USD ledger and an invoice (docs/stripe.md,
"Currency"). Fairmeter does no FX: Stripe prices ⌊micros / unit⌋ meter units at our meter's
price, so the figure a person compares with the invoice is ``rounding.line_minor`` of them.

A rate is learned from the customer's invoices (the webhooks, and ``link-customer``) or told
by the operator, and stored on the customer with the moment it was learned. The latest wins:
a changed price replaces the old one, so a statement of an earlier period is shown at today's
rate (the figure for a period invoiced at an older price is off by the price change).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

import psycopg

from metering.billing.rounding import line_minor
from metering.money import currency_text


@dataclass(frozen=True, slots=True)
class BillingRate:
    """``unit_amount_minor``: the price of one meter unit in minor units of ``currency``
    (Stripe's ``unit_amount_decimal``, kept exact); ``since``: when it was learned."""

    currency: str
    unit_amount_minor: Decimal
    since: datetime

    def invoice_minor(self, micros: int, unit_micros: int) -> int:
        """What ``micros`` of the ledger come to on the invoice: whole meter units, rounded
        down as the carry does, priced and rounded once as Stripe prices the line."""
        return line_minor(micros // unit_micros, self.unit_amount_minor)

    def invoice_text(self, micros: int, unit_micros: int) -> str:
        """The same, written for people ("1.03 EUR")."""
        return currency_text(self.invoice_minor(micros, unit_micros), self.currency)


def parse_rate(currency: str, unit_amount_decimal: str, since: datetime) -> BillingRate:
    """A rate from what Stripe (or the operator) gives: an ISO 4217 code and a decimal
    string; ValueError for anything else."""
    code = currency.strip().lower()
    if len(code) != 3 or not code.isascii() or not code.isalpha():
        raise ValueError(f"{currency!r} is not an ISO 4217 currency code")
    try:
        amount = Decimal(unit_amount_decimal.strip())
    except InvalidOperation:
        raise ValueError(f"{unit_amount_decimal!r} is not a decimal amount") from None
    if not amount.is_finite() or amount < 0:
        raise ValueError(f"{unit_amount_decimal!r} is not a price")
    return BillingRate(code, amount, since)


def rate_of_invoice(line: dict[str, Any] | None, invoice: dict[str, Any]) -> BillingRate | None:
    """The rate an invoice shows: its currency and the ``pricing.unit_amount_decimal`` of our
    meter's ``line`` ("The Invoice Line Item object" —
    https://docs.stripe.com/api/invoice-line-item/object); None without that line. Learned
    at the invoice's ``created``, so a late redelivery cannot undo a newer price."""
    amount = ((line or {}).get("pricing") or {}).get("unit_amount_decimal")
    if line is None or amount is None or not invoice.get("currency"):
        return None
    since = datetime.fromtimestamp(int(invoice["created"]), tz=UTC)
    return parse_rate(str(invoice["currency"]), str(amount), since)


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


_SET = (
    "billing_currency = %(currency)s, billing_unit_amount_decimal = %(amount)s, "
    "billing_rate_since = %(since)s"
)
_NEWER = "(billing_rate_since IS NULL OR billing_rate_since <= %(since)s)"


def _params(rate: BillingRate) -> dict[str, Any]:
    return {"currency": rate.currency, "amount": rate.unit_amount_minor, "since": rate.since}
