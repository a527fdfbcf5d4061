"""Pure: the protection report as a document (JSON-ready) and as CSV text.

Both name every amount in micro-USD; the CSV has one row per customer and a ``(total)`` row,
so a spreadsheet's sum of the customer rows equals the total row.
"""

from __future__ import annotations

import csv
import io
from typing import Any

from metering.billing.rates import invoice_document
from metering.protection.report import (
    CREDIT_KINDS,
    RULE_NAMES,
    CustomerProtection,
    Figures,
    ProtectionReport,
)
from metering.statements.render import TOTAL_ROW, csv_text

CSV_HEADER = [
    "customer",
    "runs",
    "gross_micros",
    "billed_micros",
    "held_micros",
    "credited_micros",
    *(f"credited_{kind.lower()}_micros" for kind in CREDIT_KINDS),
    "provider_cost_micros",
    "credited_provider_cost_micros",
    *(f"credited_{kind.lower()}_provider_cost_micros" for kind in CREDIT_KINDS),
    "margin_before_micros",
    "margin_after_micros",
    "uncosted_lines",
]


def figures_document(figures: Figures) -> dict[str, Any]:
    return {
        "runs": figures.runs,
        "gross_micros": figures.gross_micros,
        "billed_micros": figures.billed_micros,
        "held_micros": figures.held_micros,
        "credited_micros": figures.credited_micros,
        "credited_by_rule": figures.by_rule(),
        "provider_cost_micros": figures.cost_micros,
        "credited_provider_cost_micros": figures.credited_cost_micros,
        "credited_provider_cost_by_rule": figures.cost_by_rule(),
        "margin_before_micros": figures.margin_before_micros,
        "margin_after_micros": figures.margin_after_micros,
        "uncosted_lines": figures.uncosted_lines,
        "uncosted_gross_micros": figures.uncosted_gross_micros,
    }


# What a customer's row says while its billing currency is not known.
CURRENCY_UNKNOWN = (
    "billing currency not known yet: learned from the customer's first invoice, or set with "
    "`fairmeter stripe link-customer --currency … --unit-amount-decimal …`"
)


def _customer(row: CustomerProtection) -> dict[str, Any]:
    """The row's figures in micro-USD, and ``invoice``: billed and credited in the customer's
    billing currency (null, with ``invoice_note`` saying why, while it is not known)."""
    return {
        "customer": row.customer_id,
        **figures_document(row.figures),
        "invoice": None if row.invoice is None else invoice_document(row.invoice),
        "invoice_note": CURRENCY_UNKNOWN if row.invoice is None else None,
    }


def report_document(report: ProtectionReport) -> dict[str, Any]:
    """The report as plain data (the API's JSON body and ``--json`` output)."""
    return {
        "tenant": report.tenant_id,
        "period": report.period,
        "currency": "usd",  # every *_micros figure; a customer's ``invoice`` says its own
        "rules": dict(RULE_NAMES),
        "total": figures_document(report.total),
        "customers": [_customer(c) for c in report.customers],
        "top_by_restored_cost": [_customer(c) for c in report.top_by_restored_cost],
    }


def _csv_row(customer: str, figures: Figures) -> list[str]:
    numbers = [
        figures.runs,
        figures.gross_micros,
        figures.billed_micros,
        figures.held_micros,
        figures.credited_micros,
        *(amount for _, amount in figures.credited_by_rule),
        figures.cost_micros,
        figures.credited_cost_micros,
        *(amount for _, amount in figures.credited_cost_by_rule),
        figures.margin_before_micros,
        figures.margin_after_micros,
        figures.uncosted_lines,
    ]
    return [csv_text(customer), *(str(n) for n in numbers)]


def report_csv(report: ProtectionReport) -> str:
    """One row per customer, then ``(total)`` (customer ids are neutralised for spreadsheets)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(CSV_HEADER)
    for row in report.customers:
        writer.writerow(_csv_row(row.customer_id, row.figures))
    writer.writerow(_csv_row(TOTAL_ROW, report.total))
    return out.getvalue()
