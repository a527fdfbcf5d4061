"""``fairmeter statement``: a customer's statement as JSON, CSV or HTML, for support and scripts."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

import click
from msgspec import to_builtins

from api.statements import invoice_reply
from metering.config import load_cli_settings
from metering.db import create_db_engine, raw_transaction
from metering.keys import Principal, Scope
from metering.money import format_usd
from metering.statements import query, totals
from metering.statements.render import csv_chunks, daily_chart_svg
from metering.statements.service import (
    CURRENCY_UNKNOWN,
    build_query,
    statement_page,
)


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
    with raw_transaction(engine) as conn:
        page = statement_page(
            conn,
            operator,
            statement_query,
            now=now,
            close_delay_s=settings.period_close_delay_s,
            limit=1000,
            unit_micros=settings.stripe_meter_unit_micros,
        )
        if as_csv:
            for chunk in csv_chunks(query.stream(conn, statement_query)):
                sys.stdout.buffer.write(chunk)
            return
        if html_file is not None:
            from api.statements import TEMPLATES

            days = totals.daily(conn, statement_query)
            html_file.write_text(
                TEMPLATES.get_template("statement.html").render(
                    page=page,
                    chart=daily_chart_svg(page.period, days),
                    usd=format_usd,
                    currency_unknown=CURRENCY_UNKNOWN,
                )
            )
            click.echo(f"wrote {html_file}")
            return
    body = {
        "customer": page.customer,
        "period": page.period,
        "closed": page.closed,
        "totals": asdict(page.totals),
        "invoice": None if page.invoice is None else to_builtins(invoice_reply(page.invoice)),
        "invoice_note": CURRENCY_UNKNOWN if page.invoice is None else None,
        "lines": [asdict(line) for line in page.lines],
    }
    click.echo(json.dumps(body, default=str, indent=2))
