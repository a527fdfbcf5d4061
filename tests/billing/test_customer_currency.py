"""Issue #29: each customer's billing currency is known and stored, and the statement and the
protection report show, beside the exact USD, what the customer's EUR invoice says — the
finalized invoice less its credit notes, to the cent (one meter unit = one euro cent)."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from litestar.testing import TestClient

from api.app import create_app
from metering.config import Settings
from tests.billing.harness import (
    START,
    away_from_a_month_end,
    big_run,
    credit,
    drain,
    finalize_month_of,
    invoiced_minor,
    start_invoicing,
)
from tests.helpers import ROOT
from tests.helpers.processes import service_env

pytestmark = away_from_a_month_end()
DECEMBER = START.strftime("%Y-%m")  # the runs' month (named for the issue's example)
EUR = {"default_currency": "eur"}


def cli(settings: Settings, *args: str) -> str:
    env = service_env(settings) | {
        "FAIRMETER_STRIPE_METER_UNIT_MICROS": str(settings.stripe_meter_unit_micros),
        "FAIRMETER_STRIPE_API_BASE": str(settings.stripe_api_base),
    }
    done = subprocess.run(
        [sys.executable, "-m", "cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout


def rate_row(db: Any, customer: str) -> tuple[Any, ...]:
    row = db.execute(
        "SELECT billing_currency, billing_unit_amount_decimal, billing_rate_since IS NOT NULL "
        "FROM customers WHERE tenant_id = 'acme' AND id = %s",
        (customer,),
    ).fetchone()
    return tuple(row)


def invoiced_in_eur_with_odd_credits(
    engine: Any, stripe_settings: Settings, control: Any, link: Any, sdk: Any, api: str
) -> tuple[Settings, str]:
    """cust-c: 1,200,000 micros billed, then 123,456 and 45,678 credited after its EUR invoice
    was finalized: 1,030,866 micros = 103 whole cents; returns (settings, Stripe id)."""
    invoicing = start_invoicing(stripe_settings, control, api, emulator=EUR)
    settings = invoicing.settings
    big_run(engine, settings, "run-c", "cust-c")
    stripe_id = link("cust-c")
    pusher = invoicing.pusher(engine)
    drain(pusher, engine)
    finalize_month_of(START, invoicing.clocks, engine, settings)
    for micros in (123_456, 45_678):
        credit(engine, settings, "run-c", micros, datetime.now(UTC))
        drain(pusher, engine)
    assert invoiced_minor(sdk, stripe_id) == {DECEMBER: 103}
    return settings, stripe_id


def test_the_billing_currency_and_price_are_learned_from_the_invoice_webhooks(
    engine, stripe_settings, db, control, link, sdk, webhook_api
):
    invoicing = start_invoicing(stripe_settings, control, webhook_api, emulator=EUR)
    big_run(engine, invoicing.settings, "run-a", "cust-a")
    link("cust-a")
    assert rate_row(db, "cust-a") == (None, None, False)  # not known before an invoice

    drain(invoicing.pusher(engine), engine)
    finalize_month_of(START, invoicing.clocks, engine, invoicing.settings)

    assert rate_row(db, "cust-a") == ("eur", Decimal("1"), True)


def test_statement_and_protection_report_show_what_the_eur_invoice_less_its_credit_notes_says(
    engine, stripe_settings, db, control, link, sdk, webhook_api, make_key
):
    settings, _ = invoiced_in_eur_with_odd_credits(
        engine, stripe_settings, control, link, sdk, webhook_api
    )
    big_run(engine, settings, "run-z", "cust-z")  # never linked: its currency is not known
    admin = {"Authorization": f"Bearer {make_key(scope='admin')}"}

    with TestClient(app=create_app(settings)) as client:
        statement = client.get(f"/v1/customers/cust-c/statements/{DECEMBER}", headers=admin)
        page = client.get(f"/v1/customers/cust-c/statements/{DECEMBER}.html", headers=admin)
        unknown = client.get(f"/v1/customers/cust-z/statements/{DECEMBER}", headers=admin)
        report = client.get(f"/v1/reports/protection?period={DECEMBER}", headers=admin)

    body = statement.json()
    assert body["totals"]["billed_micros"] == 1_030_866  # the exact USD figure stays
    assert (body["invoice"]["billed"], body["invoice"]["billed_minor"]) == ("1.03 EUR", 103)
    assert body["invoice"]["currency"] == "eur" and body["invoice_note"] is None
    assert "≈ 1.03 EUR" in page.text
    assert unknown.json()["invoice"] is None
    assert "not known yet" in unknown.json()["invoice_note"]
    rows = {row["customer"]: row for row in report.json()["customers"]}
    assert rows["cust-c"]["invoice"]["billed"] == "1.03 EUR"
    assert rows["cust-z"]["invoice"] is None and "not known yet" in rows["cust-z"]["invoice_note"]

    printed = json.loads(cli(settings, "statement", "--tenant", "acme", "--customer", "cust-c",
                             "--period", DECEMBER))  # fmt: skip
    assert printed["invoice"]["billed"] == "1.03 EUR"
    summary = cli(settings, "report", "protection", "--tenant", "acme", "--period", DECEMBER)
    assert "≈ 1.03 EUR" in summary and "currency not known yet" in summary


def test_the_operator_gives_the_rate_at_link_time_and_the_statement_prices_with_it(
    engine, stripe_settings, db, make_key
):
    """0.92 minor units a unit: 120 units are 110.4 cents, which the line rounds to 1.10."""
    settings = stripe_settings.model_copy(update={"stripe_meter_unit_micros": 10_000})
    big_run(engine, settings, "run-o", "cust-o")

    said = cli(settings, "stripe", "link-customer", "--tenant", "acme", "--customer", "cust-o",
               "--stripe-id", "cus_operator", "--currency", "EUR",
               "--unit-amount-decimal", "0.92")  # fmt: skip

    assert "billing currency EUR" in said
    assert rate_row(db, "cust-o") == ("eur", Decimal("0.92"), True)
    admin = {"Authorization": f"Bearer {make_key(scope='admin')}"}
    with TestClient(app=create_app(settings)) as client:
        body = client.get(f"/v1/customers/cust-o/statements/{DECEMBER}", headers=admin).json()
    assert body["invoice"]["billed"] == "1.10 EUR"
