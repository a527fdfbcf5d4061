"""``fairmeter statement``: a customer's statement as JSON, CSV or HTML, for support and scripts."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

import click

from metering.billing.rates import CURRENCY_UNKNOWN, invoice_document
from metering.config import load_cli_settings
from metering.db import create_db_engine, raw_transaction
from metering.keys import Principal, Scope
from metering.money import format_usd
from metering.statements import query, totals
from metering.statements.render import csv_chunks
from metering.statements.service import build_query


@click.command()
@click.option("--tenant", required=True)
@click.option("--customer", required=True)
@click.option("--period", default="current", help="YYYY-MM or 'current'.")
@click.option("--csv", "as_csv", is_flag=True, help="Write CSV (all lines) to stdout.")
@click.option(
    "--html",
    "html_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the HTML page to this file.",
)
def statement(
    tenant: str, customer: str, period: str, as_csv: bool, html_file: Path | None
) -> None:
    """Print a customer's usage statement (JSON by default)."""
    settings = load_cli_settings()
    engine = create_db_engine(settings)
    operator = Principal(tenant_id=tenant, scope=Scope.ADMIN, key_id="cli")
    now = datetime.now(UTC)
    statement_query = build_query(operator, customer, period, now=now)
    # The edge's composition of the statement and its invoice figures, and its page.
    from api.statements import render_html, shown_statement

    with raw_transaction(engine) as conn:
        shown = shown_statement(conn, operator, statement_query, settings, now=now, limit=1000)
        if as_csv:
            for chunk in csv_chunks(query.stream(conn, statement_query)):
                sys.stdout.buffer.write(chunk)
            return
        if html_file is not None:
            days = totals.daily(conn, statement_query)
            html_file.write_text(render_html(shown, days, format_usd))
            click.echo(f"wrote {html_file}")
            return
    page, invoice = shown.page, shown.invoice
    body = {
        "customer": page.customer,
        "period": page.period,
        "closed": page.closed,
        "totals": asdict(page.totals),
        "invoice": None if invoice is None else invoice_document(invoice),
        "invoice_note": CURRENCY_UNKNOWN if invoice is None else None,
        "lines": [asdict(line) for line in page.lines],
    }
    click.echo(json.dumps(body, default=str, indent=2))
