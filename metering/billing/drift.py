"""Drift check: what we sent per customer and hour vs Stripe's hourly meter summaries."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg

from metering.billing.gateway import StripeGateway


@dataclass(frozen=True, slots=True)
class Difference:
    hour: datetime
    ledger_units: int
    stripe_units: int

    @property
    def delta(self) -> int:
        return self.stripe_units - self.ledger_units


def hour_floor(moment: datetime) -> datetime:
    return moment.replace(minute=0, second=0, microsecond=0)


def compare(ledger: Mapping[datetime, int], stripe: Mapping[datetime, int]) -> list[Difference]:
    """Pure: every hour where the two sides disagree, in time order."""
    hours = sorted(set(ledger) | set(stripe))
    return [
        Difference(hour, ledger.get(hour, 0), stripe.get(hour, 0))
        for hour in hours
        if ledger.get(hour, 0) != stripe.get(hour, 0)
    ]


def ledger_hourly(
    conn: psycopg.Connection[Any], tenant: str, customer: str, start: datetime, end: datetime
) -> dict[datetime, int]:
    """Meter units we delivered, by the hour of the meter event's timestamp (cancels and
    rejections Stripe reported negative)."""
    rows = conn.execute(
        """
        SELECT date_trunc('hour', ev.event_timestamp) AS hour,
               sum(CASE WHEN d.kind = 'meter_event' THEN d.units ELSE -d.units END)
        FROM stripe_deliveries d
        JOIN stripe_deliveries ev
          ON ev.kind = 'meter_event'
         AND ev.identifier = CASE WHEN d.kind = 'meter_event' THEN d.identifier
                                  ELSE d.cancels_identifier END
        WHERE d.tenant_id = %s AND d.customer_id = %s
          AND d.kind IN ('meter_event', 'meter_cancel', 'meter_rejected')
          AND (d.note IS NULL OR d.note NOT LIKE 'less than one%%')
          AND ev.event_timestamp >= %s AND ev.event_timestamp < %s
        GROUP BY 1
        """,
        (tenant, customer, start, end),
    ).fetchall()
    return {hour: int(units) for hour, units in rows if units}


def stripe_customer_id(conn: psycopg.Connection[Any], tenant: str, customer: str) -> str | None:
    row = conn.execute(
        "SELECT stripe_customer_id FROM customers WHERE tenant_id = %s AND id = %s",
        (tenant, customer),
    ).fetchone()
    return row[0] if row else None


def stripe_hourly(
    gateway: StripeGateway, stripe_customer: str, start: datetime, end: datetime
) -> dict[datetime, int]:
    meter_id = gateway.meter_id()
    buckets = gateway.hourly_summaries(
        meter_id=meter_id,
        customer=stripe_customer,
        start=hour_floor(start),
        end=hour_floor(end - timedelta(microseconds=1)) + timedelta(hours=1),
    )
    return {b.start: b.value for b in buckets if b.value}
