"""Helpers for tests that follow usage onto Stripe's invoices across a month end."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import stripe

from devtools.stripe_emulator.control_client import EmulatorControl
from metering.billing.service import handle_webhooks
from metering.config import Settings

UNIT_MICROS = 10_000  # one meter unit = one cent, priced at 1 minor unit by the emulator
SNAPSHOT_SECRET = "whsec_test"
THIN_SECRET = "whsec_thin_test"


@dataclass
class Clocks:
    """Our pusher's clock and the emulator's, moved together; the emulator's is frozen."""

    control: EmulatorControl
    offset: timedelta = field(default=timedelta(0))

    def now(self) -> datetime:
        return datetime.now(UTC) + self.offset

    def jump(self, to: datetime) -> None:
        self.offset = to - datetime.now(UTC)
        self.control.set_clock(int(to.timestamp()), frozen=True)

    def start(self) -> None:
        self.jump(datetime.now(UTC))

    @property
    def clock(self) -> Callable[[], datetime]:
        return self.now


def month_end(moment: datetime) -> datetime:
    """The start of the next UTC month (Stripe's emulator bills calendar months)."""
    first = moment.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return (first + timedelta(days=32)).replace(day=1)


def away_from_a_month_end() -> pytest.MarkDecorator:
    """These tests date runs two hours before the wall clock, may move a day on, and follow
    the runs onto their month's invoice: within a few hours after a month starts, or a day
    before it ends, the runs' month closes under them. Skipped then rather than flaky."""
    now = datetime.now(UTC)
    since_start = now - now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    until_end = month_end(now) - now
    return pytest.mark.skipif(
        since_start < timedelta(hours=4) or until_end < timedelta(hours=27),
        reason="too close to a month end",
    )


def invoicing_settings(stripe_settings: Settings, **changes: Any) -> Settings:
    return stripe_settings.model_copy(
        update={"stripe_meter_unit_micros": UNIT_MICROS, "stripe_summary_lag_s": 0.0, **changes}
    )


def subscribe_destinations(control: EmulatorControl, api: str) -> None:
    control.add_destination(url=f"{api}/webhooks/stripe", secret=SNAPSHOT_SECRET, style="snapshot")
    control.add_destination(url=f"{api}/webhooks/stripe/thin", secret=THIN_SECRET, style="thin")


def finalize_month_of(
    moment: datetime, clocks: Clocks, engine: Any, settings: Settings
) -> datetime:
    """Move past the month's end and Stripe's one-hour grace: the invoice is drafted, then
    finalized, and both webhooks are handled. Returns the new now."""
    after = month_end(moment) + timedelta(hours=1, minutes=1)
    clocks.jump(after)
    clocks.control.run_invoicing()
    handle_webhooks(engine, settings)
    return after


def period_of(stamp: int) -> str:
    return datetime.fromtimestamp(stamp, UTC).strftime("%Y-%m")


def invoiced_minor(sdk: stripe.StripeClient, stripe_id: str) -> dict[str, int]:
    """Per period: the finalized invoice's total minus its credit notes (minor units)."""
    invoices = sdk.v1.invoices.list(params={"customer": stripe_id, "limit": 100}).data
    notes = sdk.v1.credit_notes.list(params={"customer": stripe_id, "limit": 100}).data
    found: dict[str, int] = {}
    for invoice in invoices:
        assert invoice.status != "draft", "every invoice of the test is finalized"
        credited = sum(note.amount for note in notes if note.invoice == invoice.id)
        period = period_of(invoice.period_start)
        found[period] = found.get(period, 0) + invoice.total - credited
    return {period: amount for period, amount in found.items() if amount}


def billed_minor(db: Any, customer: str) -> dict[str, int]:
    """Per period: what the ledger bills the customer, in the same minor units."""
    rows = db.execute(
        "SELECT period, sum(billed_micros) FROM runs WHERE customer_id = %s GROUP BY period",
        (customer,),
    ).fetchall()
    return {period: int(micros) // UNIT_MICROS for period, micros in rows if micros}
