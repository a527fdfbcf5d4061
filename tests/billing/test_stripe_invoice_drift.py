"""Issue #29: drift at the invoice level. `fairmeter stripe drift` compares each finalized
invoice's metered line, less its credit notes, with our books and ledger per customer and
period, and never compares the hour that is still open.

One meter unit = 10,000 micros = one EUR cent on the emulator's invoices: ``big_run`` bills
1,200,000 micros, 120 units, 1.20 EUR.
"""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta

from metering.billing.drift import currency_text
from metering.billing.service import drift, recent_drift
from metering.config import Settings
from tests.billing.harness import (
    START,
    away_from_a_month_end,
    big_run,
    create_meter,
    credit,
    drain,
    finalize_month_of,
    month_end,
    push_all,
    start_invoicing,
)
from tests.helpers import ROOT
from tests.helpers.processes import service_env

pytestmark = away_from_a_month_end()
DECEMBER = START.strftime("%Y-%m")


def cli_drift(settings: Settings, customer: str) -> subprocess.CompletedProcess[str]:
    """`fairmeter stripe drift` in its own process, over the run's month, as an operator
    types it."""
    env = service_env(settings) | {
        "FAIRMETER_STRIPE_API_BASE": str(settings.stripe_api_base),
        "FAIRMETER_STRIPE_METER_UNIT_MICROS": str(settings.stripe_meter_unit_micros),
        "FAIRMETER_STRIPE_SUMMARY_LAG_S": "0",
        "FAIRMETER_STRIPE_MAX_NETWORK_RETRIES": "0",
    }
    since = (START - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S")
    until = month_end(START).strftime("%Y-%m-%dT%H:%M:%S")
    command = ["stripe", "drift", "--tenant", "acme", "--customer", customer]
    return subprocess.run(
        [sys.executable, "-m", "cli", *command, "--from", since, "--to", until],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def december_row(result: subprocess.CompletedProcess[str], *, exit_code: int) -> str:
    """The command's one line for the December invoice, once it exited ``exit_code``."""
    assert result.returncode == exit_code, result.stdout + result.stderr
    (row,) = [line for line in result.stdout.splitlines() if f"\t{DECEMBER}\t" in line]
    return row


def says(row: str, *words: str) -> None:
    for phrase in words:
        assert phrase in row, row


def invoiced_month(engine, stripe_settings, control, link, customer: str) -> tuple[str, Settings]:
    """``big_run`` for ``customer``, pushed, and its month finalized: the Stripe id and the
    invoicing settings."""
    invoicing = start_invoicing(stripe_settings, control, emulator={"default_currency": "eur"})
    big_run(engine, invoicing.settings, "run-a", customer)
    stripe_id = link(customer)
    drain(invoicing.pusher(engine), engine)
    finalize_month_of(START, invoicing.clocks, engine, invoicing.settings)
    return stripe_id, invoicing.settings


def test_a_clean_month_shows_the_same_amount_on_every_side_and_exits_zero(
    engine, stripe_settings, db, control, link, sdk
):
    _, settings = invoiced_month(engine, stripe_settings, control, link, "cust-a")

    result = cli_drift(settings, "cust-a")

    row = december_row(result, exit_code=0)
    assert row.startswith(f"ok\tacme/cust-a\t{DECEMBER}\t"), row
    says(row, "ledger 1.20 EUR", "ours 1.20 EUR", "stripe invoice 1.20 EUR")
    says(row, "credit notes 0.00 EUR", "difference +0.00 EUR", "unaccounted +0.00 EUR")
    assert result.stdout.splitlines()[-1] == "0 difference(s)"


def test_a_credit_note_issued_by_hand_is_reported_for_that_customer_and_period(
    engine, stripe_settings, db, control, link, sdk
):
    stripe_id, settings = invoiced_month(engine, stripe_settings, control, link, "cust-b")
    (invoice,) = sdk.v1.invoices.list(params={"customer": stripe_id}).data
    (line,) = invoice.lines.data
    sdk.v1.credit_notes.create(
        params={
            "invoice": invoice.id,
            "lines": [{"type": "invoice_line_item", "invoice_line_item": line.id, "amount": 7}],
        }
    )

    result = cli_drift(settings, "cust-b")

    row = december_row(result, exit_code=1)
    assert row.startswith(f"DRIFT\tacme/cust-b\t{DECEMBER}\t{invoice.id}\t"), row
    says(row, "ours 1.20 EUR", "stripe invoice 1.20 EUR", "credit notes 0.07 EUR")
    says(row, "difference -0.07 EUR", "unaccounted +0.00 EUR")
    assert result.stdout.splitlines()[-1] == "1 difference(s)"
    # The hourly beat task, an hour after the invoice was finalized, finds it in the same words.
    beat = recent_drift(engine, settings, month_end(START) + timedelta(hours=2))
    assert beat == [row.removeprefix("DRIFT\t")]


def test_our_own_credit_note_is_accounted_for_on_every_side(
    engine, stripe_settings, db, control, link, sdk
):
    """A credit of 200,000 micros after the month was invoiced: our credit note of 20 cents
    on the invoice, the ledger's 1.00 EUR, and no difference anywhere (the credit's units and
    the carry account for the ledger)."""
    _, settings = invoiced_month(engine, stripe_settings, control, link, "cust-d")
    credit(engine, settings, "run-a", 200_000, datetime.now(UTC))
    push_all(engine, settings, clock=lambda: month_end(START) + timedelta(hours=2))

    result = cli_drift(settings, "cust-d")

    row = december_row(result, exit_code=0)
    says(row, "ledger 1.00 EUR", "ours 1.00 EUR", "stripe invoice 1.20 EUR")
    says(row, "credit notes 0.20 EUR", "difference +0.00 EUR", "unaccounted +0.00 EUR")


def test_the_open_hour_and_the_hours_inside_the_summary_lag_are_never_compared(
    engine, stripe_settings, db, link, sdk, control
):
    """Someone else's meter events in the current hour and in the hour before it: with an
    hour of summary lag neither hour is compared yet; an older hour is."""
    # The events are planted a moment before the check, so Stripe's own lag is off here:
    # what is tested is which hours our check compares, not when Stripe shows an event.
    control.settings(summary_lag_s=0)
    create_meter(sdk, stripe_settings.stripe_meter_event_name)
    big_run(engine, stripe_settings, "run-c", "cust-c")  # the customer, not pushed
    stripe_id = link("cust-c")
    now = datetime.now(UTC)
    for name, moment in (("open", now), ("lagging", now - timedelta(hours=1))):
        planted(sdk, stripe_settings, stripe_id, name, moment)
    old = now - timedelta(hours=5)
    planted(sdk, stripe_settings, stripe_id, "old", old)
    lagging = stripe_settings.model_copy(update={"stripe_summary_lag_s": 3600.0})

    found = drift(engine, lagging, "acme", "cust-c", now - timedelta(days=1), now)

    assert [(d.hour, d.stripe_units) for d in found] == [
        (old.replace(minute=0, second=0, microsecond=0), 777)
    ]


def planted(sdk, settings: Settings, stripe_id: str, name: str, moment: datetime) -> None:
    """A meter event of 777 units on our meter that we did not send."""
    sdk.v1.billing.meter_events.create(
        params={
            "event_name": settings.stripe_meter_event_name,
            "identifier": f"planted-{name}",
            "payload": {"stripe_customer_id": stripe_id, "value": "777"},
            "timestamp": int(moment.timestamp()),
        }
    )


def test_amounts_read_in_the_invoice_currency_at_its_decimals():
    assert currency_text(7, "eur") == "0.07 EUR"
    assert currency_text(-7, "eur", signed=True) == "-0.07 EUR"
    assert currency_text(0, "usd", signed=True) == "+0.00 USD"
    assert currency_text(500, "jpy") == "500 JPY"  # zero-decimal: 500 yen, not 5.00
    assert currency_text(1_234, "kwd") == "1.234 KWD"  # three-decimal
