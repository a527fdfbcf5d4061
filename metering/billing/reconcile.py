"""Did a call whose outcome is unknown take effect? Asked of Stripe, never guessed.

Two cases leave a call's outcome unknown: Stripe stored a 5xx as the idempotency key's
first response and replays it on every retry ("Idempotent requests": the saved response is
returned, "including 500 errors"), or the row has retried so long that its keys and the meter
event identifier's uniqueness are about to lapse (both kept "at least 24 hours"). Blind
resending could then bill twice, and reading a summary that has not moved as "not landed"
does too: Stripe aggregates meter events asynchronously and documents no bound on the lag.

Inside the identifier window the pusher probes (step_sender.py): the same identifier under a
fresh key, which Stripe refuses as a duplicate if the first attempt landed and takes now if
it did not. Past it nothing is sent any more, and the hour's summary is read only
``stripe_summary_trust_s`` after the last call that could have landed (``trusted_at``):
customers are pushed one call at a time, so Stripe's hour total minus ours is then the
call's units (it landed) or zero (it did not); anything else keeps the row waiting, alarmed.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import Any

import psycopg

from metering.billing.drift import hour_floor, ledger_hourly, stripe_hourly
from metering.billing.gateway import StripeGateway
from metering.billing.plan import Step
from metering.config import Settings

# The start of a row's last_error while it waits past its sending window.
AWAITING = "awaiting reconciliation"


class Landed(Enum):
    YES = "landed"
    NO = "not landed"
    UNKNOWN = "unknown"


def sending_ends_at(first_attempt_at: datetime, settings: Settings) -> datetime:
    """When a row stops calling Stripe: its keys and identifiers protect a retry until at
    least 24 h after its first call, less a margin for calls in flight."""
    return first_attempt_at + _sending_window(settings)


def trusted_at(first_attempt_at: datetime, settings: Settings) -> datetime:
    """When the row's hour summary may be read as final: no call of the row starts after
    ``sending_ends_at``, and summaries lag less than ``stripe_summary_trust_s``."""
    return sending_ends_at(first_attempt_at, settings) + timedelta(
        seconds=settings.stripe_summary_trust_s
    )


def awaiting_count(conn: psycopg.Connection[Any]) -> int:
    """Pending rows the pusher last left awaiting reconciliation: past their sending window,
    summaries not trusted yet or explaining neither outcome (an operator watches this)."""
    row = conn.execute(
        "SELECT count(*) FROM stripe_outbox WHERE status = 'pending' AND last_error LIKE %s",
        (AWAITING + ":%",),
    ).fetchone()
    return int(row[0]) if row else 0


def _sending_window(settings: Settings) -> timedelta:
    window_s = settings.stripe_idempotency_window_s - settings.stripe_idempotency_margin_s
    return timedelta(seconds=window_s)


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
