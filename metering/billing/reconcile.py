"""Did a call whose outcome is unknown take effect? Asked of Stripe's meter summaries.

Two cases leave a call's outcome unknown for good: Stripe stored a 5xx as the idempotency
key's first response and replays it on every retry ("Idempotent requests": the saved
response is returned, "including 500 errors"), or the key is about to outlive Stripe's 24 h
window, after which a retry would be a new request (and the meter event identifier's
uniqueness lapses too). Blind resending could then bill twice. Customers are pushed one
call at a time, so the only unexplained difference in the hour of the call is the call
itself: Stripe's hour total minus ours is the call's units (it landed) or zero (it did not).
Summaries are eventually consistent ("Meter event summaries"), so the pusher asks only
once the call is older than ``stripe_summary_lag_s``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import Any

import psycopg

from metering.billing.drift import hour_floor, ledger_hourly, stripe_hourly
from metering.billing.gateway import StripeGateway
from metering.billing.plan import Step


class Landed(Enum):
    YES = "landed"
    NO = "not landed"
    UNKNOWN = "unknown"


def verdict(expected_units: int, stripe_minus_ours: int) -> Landed:
    """Pure: the call moved Stripe's hour by ``expected_units``, or by nothing."""
    if expected_units != 0 and stripe_minus_ours == expected_units:
        return Landed.YES
    if stripe_minus_ours == 0:
        return Landed.NO
    return Landed.UNKNOWN


def meter_hour(conn: psycopg.Connection[Any], step: Step) -> datetime:
    """The hour Stripe bills the step's meter event in (a cancel: the cancelled event's)."""
    if step.kind == "meter_event":
        return hour_floor(datetime.fromtimestamp(step.timestamp, UTC))
    row = conn.execute(
        "SELECT event_timestamp FROM stripe_deliveries WHERE kind = 'meter_event' "
        "AND identifier = %s",
        (step.cancels_identifier,),
    ).fetchone()
    assert row is not None and row[0] is not None, "a cancel names a recorded meter event"
    return hour_floor(row[0])


def our_hour(
    conn: psycopg.Connection[Any], tenant: str, customer: str, step: Step
) -> tuple[datetime, int]:
    """The step's hour and the units our recorded deliveries put there (read in a short
    transaction; Stripe is asked after it)."""
    hour = meter_hour(conn, step)
    return hour, ledger_hourly(conn, tenant, customer, hour, hour + timedelta(hours=1)).get(hour, 0)


def meter_call_landed(
    gateway: StripeGateway, stripe_customer: str, step: Step, hour: datetime, ours: int
) -> tuple[Landed, int]:
    """Whether a meter event or cancel took effect, and Stripe's hour minus ours."""
    theirs = stripe_hourly(gateway, stripe_customer, hour, hour + timedelta(hours=1)).get(hour, 0)
    expected = step.units if step.kind == "meter_event" else -step.units
    return verdict(expected, theirs - ours), theirs - ours
