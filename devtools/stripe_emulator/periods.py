"""Billing periods: monthly from a subscription's billing-cycle anchor.

"A monthly subscription with a billing cycle anchor date of September 2 always bills on the
2nd day of the month"; one anchored on January 31 "bills the last day of the month closest to
the anchor date, so February 28 (or February 29 in a leap year), then March 31, April 30"
("Set the subscription billing renewal date",
https://docs.stripe.com/billing/subscriptions/billing-cycle). An anchor at a month's start
gives UTC calendar months.
"""

from __future__ import annotations

import calendar
from datetime import UTC, datetime


def month_start(instant: int) -> int:
    """The start of the UTC month holding ``instant`` (unix seconds)."""
    moment = datetime.fromtimestamp(instant, UTC)
    return int(datetime(moment.year, moment.month, 1, tzinfo=UTC).timestamp())


def add_months(anchor: int, months: int) -> int:
    """The anchor's day and time of day ``months`` later, on the month's last day when the
    month is shorter than the anchor's day."""
    moment = datetime.fromtimestamp(anchor, UTC)
    year, month = divmod(moment.year * 12 + moment.month - 1 + months, 12)
    day = min(moment.day, calendar.monthrange(year, month + 1)[1])
    return int(moment.replace(year=year, month=month + 1, day=day).timestamp())


def next_billing_date(anchor: int, after: int) -> int:
    """The first billing date of the monthly cycle anchored at ``anchor`` later than ``after``
    (the anchor itself while ``after`` is before it: the first, partial period ends there)."""
    if after < anchor:
        return anchor
    start, moment = datetime.fromtimestamp(anchor, UTC), datetime.fromtimestamp(after, UTC)
    months = max(0, (moment.year - start.year) * 12 + moment.month - start.month - 1)
    while (boundary := add_months(anchor, months)) <= after:
        months += 1
    return boundary


def current_period(anchor: int, first_start: int, now: int) -> tuple[int, int]:
    """The period holding ``now`` of a cycle anchored at ``anchor`` that began at
    ``first_start``: ``(start, end)``."""
    start = first_start
    while (end := next_billing_date(anchor, start)) <= now:
        start = end
    return start, end


def iso(instant: int) -> str:
    """Stripe's v2 timestamp text, e.g. ``2026-01-31T23:59:00.000Z``."""
    return datetime.fromtimestamp(instant, UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")
