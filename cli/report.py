"""``fairmeter report protection``: what protection credited and cost the platform in a month."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import click

from metering.config import load_cli_settings
from metering.db import create_db_engine, raw_transaction
from metering.keys import Principal, Scope
from metering.money import display_usd
from metering.protection.export import CURRENCY_UNKNOWN, report_csv, report_document
from metering.protection.report import (
    CREDIT_KINDS,
    RULE_NAMES,
    CustomerProtection,
    Figures,
    ProtectionReport,
)
from metering.protection.service import report_for


@click.group()
def report() -> None:
    """Operator reports."""


@report.command("protection")
@click.option("--tenant", required=True)
@click.option("--period", default="current", help="YYYY-MM or 'current'.")
@click.option("--csv", "as_csv", is_flag=True, help="CSV: a row per customer and a total row.")
@click.option("--json", "as_json", is_flag=True, help="The API's JSON document.")
def protection(tenant: str, period: str, as_csv: bool, as_json: bool) -> None:
    """Credits by rule, their provider cost, and margins before and after protection."""
    settings = load_cli_settings()
    engine = create_db_engine(settings)
    operator = Principal(tenant_id=tenant, scope=Scope.ADMIN, key_id="cli")
    with raw_transaction(engine) as conn:
        found = report_for(
            conn,
            operator,
            period,
            datetime.now(UTC),
            unit_micros=settings.stripe_meter_unit_micros,
        )
    if as_csv:
        click.echo(report_csv(found), nl=False)
    elif as_json:
        click.echo(json.dumps(report_document(found), indent=2))
    else:
        click.echo(summary(found))


def _usd(micros: int) -> str:
    return f"{display_usd(micros)} USD"


def _figures(figures: Figures) -> list[str]:
    lines = [
        f"  runs                      {figures.runs}",
        f"  gross                     {_usd(figures.gross_micros)}",
        f"  billed                    {_usd(figures.billed_micros)}",
        f"  held for review           {_usd(figures.held_micros)}",
        f"  credited                  {_usd(figures.credited_micros)}",
    ]
    by_rule, cost_by_rule = figures.by_rule(), figures.cost_by_rule()
    for kind in CREDIT_KINDS:
        if by_rule[kind]:
            label = f"{kind} {RULE_NAMES[kind]}" if kind.startswith("R") else RULE_NAMES[kind]
            cost = _usd(cost_by_rule[kind])
            lines.append(f"    {label:<24}{_usd(by_rule[kind])}, provider cost {cost}")
    lines += [
        f"  provider cost, all usage  {_usd(figures.cost_micros)}",
        f"  provider cost, credited   {_usd(figures.credited_cost_micros)}",
        f"  margin before protection  {_usd(figures.margin_before_micros)}",
        f"  margin after protection   {_usd(figures.margin_after_micros)}",
    ]
    if figures.uncosted_lines:
        lines.append(
            f"  ! {figures.uncosted_lines} usage line(s) have no provider cost "
            f"({_usd(figures.uncosted_gross_micros)} gross): load them with `fairmeter costs load`"
        )
    return lines


def summary(found: ProtectionReport) -> str:
    """The report for a person: the total, then the top customers by restored cost."""
    lines = [f"Cost of protection — tenant {found.tenant_id}, {found.period}", "", "Total"]
    lines += _figures(found.total)
    if found.top_by_restored_cost:
        lines += ["", "Top customers by restored provider cost"]
        for row in found.top_by_restored_cost:
            cost = _usd(row.figures.credited_cost_micros)
            lines.append(f"  {row.customer_id:<26}{cost} of {_usd(row.figures.credited_micros)}")
    lines += ["", "On the customers' invoices (billed, credited)"]
    lines += [_on_invoice(row) for row in found.customers]
    return "\n".join(lines)


def _on_invoice(row: CustomerProtection) -> str:
    """A customer's billed and credited as its invoice counts them, beside the exact USD."""
    usd = f"{_usd(row.figures.billed_micros)}, {_usd(row.figures.credited_micros)}"
    if row.invoice is None:
        return f"  {row.customer_id:<26}{usd} — {CURRENCY_UNKNOWN}"
    on_invoice = f"≈ {row.invoice.billed_text}, ≈ {row.invoice.credited_text}"
    return f"  {row.customer_id:<26}{usd} — {on_invoice} on the invoice"
