"""Billing periods: calendar months in UTC, and when a month's statement closes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta


def period_of(moment: datetime) -> str:
    """A run belongs to the month it ended in."""
    return moment.astimezone(UTC).strftime("%Y-%m")


def period_close(period: str, delay: timedelta) -> datetime:
    """When a period's statement closes: the start of the next month, plus ``delay``."""
    year, month = (int(part) for part in period.split("-"))
    year, month = (year + 1, 1) if month == 12 else (year, month + 1)
    return datetime(year, month, 1, tzinfo=UTC) + delay


def statement_period(run_period: str, now: datetime, delay: timedelta) -> str:
    """The run's period while its statement is open; else the period the change is made in."""
    return run_period if now < period_close(run_period, delay) else period_of(now)


def previous_period(period: str) -> str:
    """The month before ``period``."""
    year, month = (int(part) for part in period.split("-"))
    year, month = (year - 1, 12) if month == 1 else (year, month - 1)
    return f"{year:04d}-{month:02d}"


def closed_periods(now: datetime, delay: timedelta, count: int) -> list[str]:
    """The ``count`` latest periods whose statement has closed at ``now``, newest first."""
    period = previous_period(period_of(now))
    if now < period_close(period, delay):
        period = previous_period(period)
    periods = []
    for _ in range(count):
        periods.append(period)
        period = previous_period(period)
    return periods
