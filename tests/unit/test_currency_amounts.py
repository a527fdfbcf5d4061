"""One way to write an amount in a currency's minor units, and one way micros become them."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest

from metering.billing.rates import BillingRate, parse_rate
from metering.money import currency_text

LEARNED = datetime(2026, 12, 1, tzinfo=UTC)


def test_an_amount_is_written_at_its_currencys_decimals_with_its_code():
    assert currency_text(103, "eur") == "1.03 EUR"
    assert currency_text(-7, "eur", signed=True) == "-0.07 EUR"
    assert currency_text(500, "jpy") == "500 JPY"  # zero-decimal: 500 yen, not 5.00
    assert currency_text(1_234, "kwd") == "1.234 KWD"  # three-decimal


def test_micros_become_whole_units_rounded_down_then_the_line_rounded_half_up_once():
    rate = BillingRate("eur", Decimal("0.92"), LEARNED)
    # 1,030,866 micros = 103 whole units (the 0.0866 is the carry, never invoiced);
    # 103 × 0.92 = 94.76 cents, rounded once to 95.
    assert rate.invoice_minor(1_030_866, 10_000) == 95
    assert rate.invoice_text(1_030_866, 10_000) == "0.95 EUR"
    assert BillingRate("eur", Decimal("0.005"), LEARNED).invoice_minor(1_000_000, 10_000) == 1


def test_a_rate_is_an_iso_code_and_a_decimal_price():
    assert parse_rate("EUR", "0.92", LEARNED) == BillingRate("eur", Decimal("0.92"), LEARNED)
    for currency, amount in (("euro", "1"), ("eur", "abc"), ("eur", "-1"), ("eur", "NaN")):
        with pytest.raises(ValueError):
            parse_rate(currency, amount, LEARNED)
