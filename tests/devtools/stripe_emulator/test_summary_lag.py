"""Meter event summaries are eventually consistent: they lag what Stripe has received."""

from __future__ import annotations

import stripe

from devtools.stripe_emulator.control_client import EmulatorControl
from tests.devtools.stripe_emulator.invoicing_harness import (
    FEB_1,
    JAN_1,
    at,
    cancel_usage,
    send_usage,
    summed_usage,
)


def test_summaries_show_events_and_cancellations_only_after_the_lag(
    client: stripe.StripeClient,
    control: EmulatorControl,
    meter: stripe.billing.Meter,
    customer: stripe.Customer,
) -> None:
    control.settings(summary_lag_s=120)
    control.set_clock(at(2026, 1, 20), frozen=True)
    send_usage(client, customer.id, 7, timestamp=at(2026, 1, 19), identifier="u1")

    def usage() -> int:
        return summed_usage(client, meter.id, customer.id, JAN_1, FEB_1)

    before = usage()
    control.advance_clock(120)
    arrived = usage()
    cancel_usage(client, "u1")
    still_counted = usage()
    control.advance_clock(120)

    assert (before, arrived, still_counted, usage()) == (0, 7, 7, 0)
