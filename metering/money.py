"""Money is integer micro-USD everywhere. The one rounding function lives here, and the
one way an amount in another currency's minor units is written."""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal

MICROS_PER_USD = 1_000_000
TOKENS_PER_PRICE_UNIT = 1_000_000  # catalog prices are per million tokens


def round_half_even_div(numerator: int, denominator: int) -> int:
    """Integer division rounded half to even, exactly (no floats anywhere).

    Used for every price × tokens product so that the same line always costs the same
    micros, whatever machine computes it.
    """
    if denominator <= 0:
        raise ValueError("denominator must be positive")
    quotient, remainder = divmod(numerator, denominator)
    twice = 2 * remainder
    if twice > denominator or (twice == denominator and quotient % 2 == 1):
        quotient += 1
    return quotient


def format_usd(micros: int, places: int = 2) -> str:
    """Render micros as a dollar string, rounded half-even to ``places`` decimals."""
    value = (Decimal(micros) / MICROS_PER_USD).quantize(
        Decimal(1).scaleb(-places), rounding=ROUND_HALF_EVEN
    )
    return f"{value:.{places}f}"


def describe_usd(micros: int) -> str:
    """Dollars for people: cents when the amount is whole cents, else every digit needed.

    "0.01 USD" for a 0.0105 USD refund would hide half of it, so sub-cent amounts keep their
    exact micro digits ("0.0105").
    """
    if micros % 10_000 == 0:
        return format_usd(micros)
    return format_usd(micros, 6).rstrip("0")


def display_usd(micros: int) -> str:
    """Dollars on a page: cents from one dollar up, every digit needed below it.

    Below a dollar, rounding to the cent is what hides money: a 0.0042 USD hold reads
    0.00 and 0.174 = 0.166 + 0.008 reads 0.17 = 0.17 + 0.01. So nothing under a dollar is
    rounded (``describe_usd``); above it, cents are what a person compares, and the page
    gives the exact figure on hover.
    """
    if abs(micros) < MICROS_PER_USD:
        return describe_usd(micros)
    return format_usd(micros)


# "Zero-decimal" and "three-decimal" currencies — https://docs.stripe.com/currencies
ZERO_DECIMAL = frozenset(
    [
        "bif",
        "clp",
        "djf",
        "gnf",
        "jpy",
        "kmf",
        "krw",
        "mga",
        "pyg",
        "rwf",
        "ugx",
        "vnd",
        "vuv",
        "xaf",
        "xof",
        "xpf",
    ]
)
THREE_DECIMAL = frozenset({"bhd", "jod", "kwd", "omr", "tnd"})


def currency_text(minor: int, currency: str, signed: bool = False) -> str:
    """Minor units of ``currency`` (Stripe's lowercase ISO code) for people, with the code:
    ``describe_usd``'s rule (every digit needed), at the currency's decimals — 103 ``eur`` is
    "1.03 EUR", 500 ``jpy`` "500 JPY", 1234 ``kwd`` "1.234 KWD"."""
    places = 0 if currency in ZERO_DECIMAL else 3 if currency in THREE_DECIMAL else 2
    text = describe_usd(minor * 10 ** (6 - places))
    if places == 0:
        text = text.split(".")[0]
    sign = "+" if signed and minor >= 0 else ""
    return f"{sign}{text} {currency.upper()}"
