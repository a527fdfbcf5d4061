"""Reading the console's forms: USD amounts, percentages, free text and the credit choice."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal, InvalidOperation

from metering.disputes.service import Credit
from metering.errors import FieldError, MeteringError, validation_error
from metering.money import MICROS_PER_USD

MAX_TEXT = 2000


def _bad(field: str, message: str) -> MeteringError:
    return validation_error([FieldError(field, "invalid_form", message)], detail=message)


def usd_to_micros(text: str, field: str = "amount_usd") -> int:
    """An amount typed in USD ("1.23", "$0.000001") as exact micro-USD; no floats, no rounding.

    Commas are refused rather than guessed at: "1,23" is 1.23 in much of the world and 123
    to a thousands-separator parser.
    """
    cleaned = text.strip().removeprefix("$").strip()
    if "," in cleaned:
        raise _bad(field, "use a dot for decimals and no thousands separators, e.g. 1234.56")
    try:
        amount = Decimal(cleaned)
    except InvalidOperation:
        raise _bad(field, "enter an amount in USD, e.g. 1.23") from None
    if not amount.is_finite() or amount <= 0:
        raise _bad(field, "enter a positive amount in USD")
    exponent = amount.normalize().as_tuple().exponent
    if isinstance(exponent, int) and exponent < -6:
        raise _bad(field, "amounts have at most 6 decimals (one micro-dollar)")
    micros = amount * MICROS_PER_USD
    if micros != micros.to_integral_value() or micros > 10**15:
        raise _bad(field, "enter an amount in USD, e.g. 1.23")
    return int(micros)


def percent_text(text: str) -> str:
    """A percentage in (0, 100] with at most two decimals, as decimal text for :class:`Credit`."""
    cleaned = text.strip().removesuffix("%").strip()
    try:
        percent = Decimal(cleaned)
    except InvalidOperation:
        raise _bad("percent", "enter a percentage between 0 and 100, e.g. 25") from None
    if not percent.is_finite() or not Decimal(0) < percent <= Decimal(100):
        raise _bad("percent", "enter a percentage between 0 and 100, e.g. 25")
    exponent = percent.normalize().as_tuple().exponent
    if isinstance(exponent, int) and exponent < -2:
        raise _bad("percent", "percentages have at most 2 decimals")
    return cleaned


def credit_from(form: Mapping[str, str]) -> Credit:
    """The credit chosen on the approve form: full, an amount in USD, or a percentage."""
    kind = form.get("credit", "")
    if kind == "full":
        return Credit(full=True)
    if kind == "amount":
        return Credit(amount_micros=usd_to_micros(form.get("amount_usd", "")))
    if kind == "percent":
        return Credit(percent=percent_text(form.get("percent", "")))
    raise _bad("credit", "choose a full credit, an amount or a percentage")


def required_text(form: Mapping[str, str], field: str, message: str) -> str:
    text = form.get(field, "").strip()
    if not text:
        raise _bad(field, message)
    if len(text) > MAX_TEXT:
        raise _bad(field, f"keep it under {MAX_TEXT} characters")
    return text


def day_start(text: str | None, *, next_day: bool = False) -> datetime | None:
    """A ``YYYY-MM-DD`` search field as a UTC instant (the day after, for an inclusive end)."""
    if not text:
        return None
    try:
        day = date.fromisoformat(text)
    except ValueError:
        return None
    moment = datetime(day.year, day.month, day.day, tzinfo=UTC)
    return moment + timedelta(days=1) if next_day else moment


def safe_next(path: str | None) -> str:
    """Where to go after signing in: only console pages, never another site."""
    console_page = path == "/console" or (path or "").startswith("/console/")
    if path and console_page and "\\" not in path:
        return path
    return "/console"
