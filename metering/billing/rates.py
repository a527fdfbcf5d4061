"""A customer's billing rate: the currency of its invoices and the price of one meter unit in
it — the only conversion between the micro-USD ledger and an invoice (docs/stripe.md,
"Currency"). Fairmeter does no FX: Stripe prices ⌊micros / unit⌋ meter units at our meter's
price, so the figure a person compares with the invoice is ``rounding.line_minor`` of them.

A rate is learned from the customer's invoices (the webhooks, and ``link-customer``) or told
by the operator, and stored on the customer with the moment it was learned (``rate_store``).
The latest wins: a changed price replaces the old one, so a statement of an earlier period
is shown at today's rate (a period invoiced at an older price reads off by the change).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from metering.billing.rounding import line_minor
from metering.money import currency_text

# What a customer reads while its billing currency is not known.
CURRENCY_UNKNOWN = (
    "The amount in your invoice's currency is not known yet: it appears once your first "
    "invoice is created. The USD figures are exact."
)


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


@dataclass(frozen=True, slots=True)
class InvoiceFigures:
    """A customer's charged and restored micros as its invoice counts them, at ``rate``:
    ``billed_minor`` is what the period's invoice less its credit notes says (the ledger's
    billed micros are net of credits); ``credited_minor`` is the restored usage priced the
    same way, for comparison with the credit notes."""

    rate: BillingRate
    billed_minor: int
    credited_minor: int

    @classmethod
    def of(
        cls, rate: BillingRate, billed_micros: int, credited_micros: int, unit_micros: int
    ) -> InvoiceFigures:
        return cls(
            rate,
            rate.invoice_minor(billed_micros, unit_micros),
            rate.invoice_minor(credited_micros, unit_micros),
        )

    @property
    def billed_text(self) -> str:
        return currency_text(self.billed_minor, self.rate.currency)

    @property
    def credited_text(self) -> str:
        return currency_text(self.credited_minor, self.rate.currency)


def invoice_document(figures: InvoiceFigures) -> dict[str, Any]:
    """The figures as plain data, one shape wherever they are shown (statement, report)."""
    return {
        "currency": figures.rate.currency,
        "unit_amount_decimal": str(figures.rate.unit_amount_minor),
        "rate_since": figures.rate.since.isoformat(),
        "billed_minor": figures.billed_minor,
        "credited_minor": figures.credited_minor,
        "billed": figures.billed_text,
        "credited": figures.credited_text,
    }


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
