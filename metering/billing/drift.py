"""Drift checks, per customer: what we sent per hour vs Stripe's hourly meter summaries
(closed hours only), and each finalized invoice and its credit notes vs our books, with the
ledger of the invoice's period vs what our deliveries, unsent rows and carry account for —
so a difference reads as ours-vs-Stripe or ledger-vs-ours."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from functools import partial
from typing import Any

import psycopg

from metering.billing.gateway import StripeGateway
from metering.billing.plan import Step, carry_effect
from metering.billing.rounding import line_minor
from metering.config import Settings
from metering.money import currency_text
from metering.periods import period_of


@dataclass(frozen=True, slots=True)
class Difference:
    hour: datetime
    ledger_units: int
    stripe_units: int

    @property
    def delta(self) -> int:
        return self.stripe_units - self.ledger_units


def describe_hour(tenant: str, customer: str, difference: Difference) -> str:
    """One line for a person (the CLI prints it, the beat task logs it)."""
    d = difference
    return (
        f"{tenant}/{customer}\t{d.hour.isoformat()}\tsent {d.ledger_units} unit(s)\t"
        f"stripe {d.stripe_units} unit(s)\tdelta {d.delta:+d}"
    )


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


# Hours still open


def summary_lag(settings: Settings) -> timedelta:
    """How long after an hour ends Stripe's summaries of it are trusted (the one place that
    names the setting)."""
    return timedelta(seconds=settings.stripe_summary_lag_s)


def compared_until(now: datetime, settings: Settings) -> datetime:
    """The end of the last hour the summary check compares: an hour that has not ended, or
    ended within the summary lag, is still moving in Stripe ("Meter events are aggregated
    asynchronously … an eventually consistent view" — Meter Event Summary,
    https://docs.stripe.com/api/billing/meter-event-summary) and would show drift that is
    only lag."""
    return hour_floor(now - summary_lag(settings))


# Invoices


@dataclass(frozen=True, slots=True)
class StripeInvoice:
    """A finalized invoice as the drift check reads it: our meter's line and its credits."""

    id: str
    currency: str
    period_start: datetime
    period_end: datetime
    line_minor: int  # the metered line's amount (0 without a line on our meter)
    credited_minor: int  # credit notes on that line, not void
    unit_amount_minor: Decimal  # the line's pricing.unit_amount_decimal

    @property
    def period(self) -> str:
        return period_of(self.period_start)


@dataclass(frozen=True, slots=True)
class OurBooks:
    """Our side of one invoice: the units it should bill, and the ledger of its period."""

    metered_units: int  # live meter events dated in the period
    credited_units: int  # our credit notes on the invoice
    ledger_micros: int  # Σ runs.billed_micros of the period
    accounted_micros: int  # deliveries + unsent rows + carry of the period


@dataclass(frozen=True, slots=True)
class InvoiceDrift:
    """One customer's finalized invoice compared with our books."""

    tenant: str
    customer: str
    invoice: StripeInvoice
    books: OurBooks
    unit_micros: int

    @property
    def ours_minor(self) -> int:
        """What our books say Stripe should bill on the invoice: a negative cycle total is
        invoiced as 0 ("Fix incorrect usage data" —
        https://docs.stripe.com/billing/subscriptions/usage-based/meters/configure), and
        priced as Stripe prices the line (``rounding.line_minor``: round half up)."""
        units = max(0, self.books.metered_units) - self.books.credited_units
        return line_minor(units, self.invoice.unit_amount_minor)

    @property
    def stripe_minor(self) -> int:
        return self.invoice.line_minor - self.invoice.credited_minor

    @property
    def difference_minor(self) -> int:
        """Stripe − ours: positive when Stripe bills more than our books say."""
        return self.stripe_minor - self.ours_minor

    @property
    def unaccounted_micros(self) -> int:
        """Ledger − what our deliveries, unsent rows and carry account for."""
        return self.books.ledger_micros - self.books.accounted_micros

    @property
    def drifted(self) -> bool:
        return self.difference_minor != 0 or self.unaccounted_micros != 0

    def minor_of(self, micros: int) -> int:
        """Ledger micros in the invoice's minor units, as the line would price them."""
        units = Decimal(micros) / self.unit_micros
        price = units * self.invoice.unit_amount_minor
        return int(price.to_integral_value(rounding=ROUND_HALF_UP))

    def describe(self) -> str:
        """One line for a person (the CLI prints it, the beat task logs it)."""
        money = partial(currency_text, currency=self.invoice.currency)
        return (
            f"{self.tenant}/{self.customer}\t{self.invoice.period}\t{self.invoice.id}\t"
            f"ledger {money(self.minor_of(self.books.ledger_micros))}\t"
            f"ours {money(self.ours_minor)}\t"
            f"stripe invoice {money(self.invoice.line_minor)}\t"
            f"credit notes {money(self.invoice.credited_minor)}\t"
            f"difference {money(self.difference_minor, signed=True)}\t"
            f"unaccounted {money(self.minor_of(self.unaccounted_micros), signed=True)}"
        )


def stripe_invoices(
    gateway: StripeGateway, stripe_customer: str, start: datetime, end: datetime
) -> list[StripeInvoice]:
    """The customer's finalized invoices whose period overlaps ``[start, end)``. Drafts are
    skipped: until finalization Stripe "updates it to reflect the latest quantity" ("Configure
    an invoice finalization grace period" —
    https://docs.stripe.com/billing/subscriptions/usage-based/configure-grace-period)."""
    found = []
    for data in gateway.customer_invoices(stripe_customer):
        period_start, period_end = _utc(data["period_start"]), _utc(data["period_end"])
        if data["status"] == "draft" or period_end <= start or period_start >= end:
            continue
        line = gateway.metered_line_of(data)
        pricing = (line or {}).get("pricing") or {}
        credited = gateway.credited_by_line(str(data["id"])) if line else {}
        found.append(
            StripeInvoice(
                id=str(data["id"]),
                currency=str(data["currency"]),
                period_start=period_start,
                period_end=period_end,
                line_minor=int((line or {}).get("amount") or 0),
                credited_minor=credited.get(str((line or {}).get("id")), 0),
                unit_amount_minor=Decimal(str(pricing.get("unit_amount_decimal") or 0)),
            )
        )
    return found


def _utc(seconds: int) -> datetime:
    return datetime.fromtimestamp(int(seconds), UTC)


def our_books(
    conn: psycopg.Connection[Any], tenant: str, customer: str, invoice: StripeInvoice, unit: int
) -> OurBooks:
    """Our side of ``invoice``: live meter units dated in its period (not cancelled, not
    rejected), the units our credit notes took off it, and the ledger of its period."""
    keys = {"t": tenant, "c": customer, "start": invoice.period_start, "end": invoice.period_end}
    metered, credited = conn.execute(
        """
        SELECT coalesce(sum(d.units) FILTER (WHERE d.kind = 'meter_event'
                   AND d.event_timestamp >= %(start)s AND d.event_timestamp < %(end)s
                   AND NOT EXISTS (SELECT 1 FROM stripe_deliveries x
                                   WHERE x.tenant_id = d.tenant_id
                                     AND x.kind IN ('meter_cancel', 'meter_rejected')
                                     AND x.cancels_identifier = d.identifier)), 0),
               coalesce(sum(d.units) FILTER (WHERE d.kind = 'credit_note'
                   AND d.invoice_id = %(invoice)s), 0)
        FROM stripe_deliveries d WHERE d.tenant_id = %(t)s AND d.customer_id = %(c)s
        """,
        keys | {"invoice": invoice.id},
    ).fetchone() or (0, 0)
    ledger, accounted = ledger_period(conn, tenant, customer, invoice.period, unit)
    return OurBooks(int(metered), int(credited), ledger, accounted)


def ledger_period(
    conn: psycopg.Connection[Any], tenant: str, customer: str, period: str, unit: int
) -> tuple[int, int]:
    """(Σ runs.billed_micros of the period, what accounts for it). What accounts for the
    ledger is counted over the customer's whole history, since a step lands in the period of
    its own date (a late increase goes to the open period, a credit note to its invoice's)
    and the carry is kept per landing period: the units our deliveries make Stripe bill
    (× ``unit``), plus every period's carry as it stood before unsent planned steps moved it,
    plus what unsent rows still have to deliver. The period's share is its ledger less the
    customer's unaccounted difference; equal unless a delivery, a row or a carry was lost."""
    keys = {"t": tenant, "c": customer, "p": period, "u": unit}
    ledger, ledger_all, delivered = conn.execute(
        """
        SELECT (SELECT coalesce(sum(billed_micros), 0) FROM runs
                WHERE tenant_id = %(t)s AND customer_id = %(c)s AND period = %(p)s),
               (SELECT coalesce(sum(billed_micros), 0) FROM runs
                WHERE tenant_id = %(t)s AND customer_id = %(c)s),
               (SELECT coalesce(sum(CASE d.kind WHEN 'meter_event' THEN d.units * %(u)s
                                    WHEN 'balance_credit' THEN -d.cents * 10000
                                    ELSE -d.units * %(u)s END), 0)
                FROM stripe_deliveries d
                WHERE d.tenant_id = %(t)s AND d.customer_id = %(c)s)
        """,
        keys,
    ).fetchone() or (0, 0, 0)
    (carries,) = conn.execute(
        "SELECT coalesce(sum(carry_micros), 0) FROM stripe_carries "
        "WHERE tenant_id = %(t)s AND customer_id = %(c)s",
        keys,
    ).fetchone() or (0,)
    accounted_all = int(delivered) + int(carries) + _unsent(conn, keys)
    return int(ledger), int(ledger) - (int(ledger_all) - accounted_all)


def _unsent(conn: psycopg.Connection[Any], keys: dict[str, Any]) -> int:
    """What the customer's rows not sent yet still owe Stripe (target − delivered, for a
    run's latest row), less what their unsent planned steps already moved the carries by."""
    rows = conn.execute(
        """
        SELECT o.status, o.plan, o.next_step, o.target_billed_micros,
               o.decision_version = max(o.decision_version) OVER (PARTITION BY o.run_id),
               (SELECT coalesce(sum(d.micros), 0) FROM stripe_deliveries d
                WHERE d.tenant_id = o.tenant_id AND d.run_id = o.run_id)
        FROM stripe_outbox o
        WHERE o.tenant_id = %(t)s AND o.customer_id = %(c)s AND o.status <> 'superseded'
        """,
        keys,
    ).fetchall()
    owed = 0
    for status, steps, next_step, target, latest, delivered in rows:
        if status == "sent":
            continue
        moved = carry_effect([Step.from_json(s) for s in (steps or [])[next_step:]], keys["u"])
        owed -= sum(moved.values())
        owed += int(target) - int(delivered) if latest else 0
    return owed
