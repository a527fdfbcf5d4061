"""Billing periods: UTC calendar months (the emulator models no billing-cycle anchors)."""

from __future__ import annotations

from datetime import UTC, datetime


def month_start(instant: int) -> int:
    """The start of the UTC month holding ``instant`` (unix seconds)."""
    moment = datetime.fromtimestamp(instant, UTC)
    return int(datetime(moment.year, moment.month, 1, tzinfo=UTC).timestamp())


def next_month(period_start: int) -> int:
    """The start of the month after the one starting at ``period_start``."""
    moment = datetime.fromtimestamp(period_start, UTC)
    year, month = (moment.year + 1, 1) if moment.month == 12 else (moment.year, moment.month + 1)
    return int(datetime(year, month, 1, tzinfo=UTC).timestamp())


def iso(instant: int) -> str:
    """Stripe's v2 timestamp text, e.g. ``2026-01-31T23:59:00.000Z``."""
    return datetime.fromtimestamp(instant, UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")
