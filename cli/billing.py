"""``fairmeter stripe …``: link customers, push, dead letter, drift."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import click

from metering.config import load_cli_settings
from metering.db import create_db_engine, raw_transaction


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


@click.group()
def stripe() -> None:
    """Stripe metered billing."""


@stripe.command("link-customer")
@click.option("--tenant", required=True)
@click.option("--customer", required=True)
@click.option("--stripe-id", required=True, help="The Stripe customer id (cus_…).")
@click.option("--currency", default=None, help="The invoices' currency (ISO 4217, e.g. eur).")
@click.option(
    "--unit-amount-decimal",
    default=None,
    help="The price of one meter unit in minor units of --currency, as the Stripe price says.",
)
def link_customer(
    tenant: str,
    customer: str,
    stripe_id: str,
    currency: str | None,
    unit_amount_decimal: str | None,
) -> None:
    """Set a customer's Stripe id and billing rate; its waiting outbox rows become due.

    The rate is the operator's (--currency with --unit-amount-decimal), else the one the
    customer's newest invoice in Stripe shows, else learned from its first invoice."""
    from metering.billing.rates import parse_rate
    from metering.billing.service import latest_invoice_rate
    from metering.billing.service import link_customer as link

    if (currency is None) != (unit_amount_decimal is None):
        raise click.UsageError("give --currency and --unit-amount-decimal together")
    settings = load_cli_settings()
    try:
        rate = (
            parse_rate(currency, unit_amount_decimal, datetime.now(UTC))
            if currency is not None and unit_amount_decimal is not None
            else latest_invoice_rate(settings, stripe_id)
        )
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    released = link(create_db_engine(settings), tenant, customer, stripe_id, rate)
    click.echo(f"linked {customer} to {stripe_id}; {released} waiting row(s) released")
    if rate is None:
        click.echo("billing currency not known yet: learned from the customer's first invoice")
    else:
        unit = f"{rate.unit_amount_minor} {rate.currency.upper()} minor unit(s)"
        click.echo(f"billing currency {rate.currency.upper()}: one meter unit = {unit}")


@stripe.command("push")
def push() -> None:
    """Drain due outbox rows to Stripe once, in this process."""
    from metering.billing.push import Pusher

    settings = load_cli_settings()
    report = Pusher(create_db_engine(settings), settings).push_due()
    click.echo(
        f"{report.sent_rows} row(s) sent, {report.calls} call(s), "
        f"{report.retried} to retry, {report.dead} dead"
    )


@stripe.command("dead")
@click.option("--tenant", default=None)
@click.option("--retry", "retry_ids", multiple=True, type=int, help="Retry these row ids.")
@click.option("--retry-all", is_flag=True, help="Retry every dead row (of --tenant).")
def dead(tenant: str | None, retry_ids: tuple[int, ...], retry_all: bool) -> None:
    """List dead-lettered outbox rows, or send them back to pending."""
    from metering.billing import outbox

    settings = load_cli_settings()
    engine = create_db_engine(settings)
    with raw_transaction(engine) as conn:
        if retry_ids or retry_all:
            count = outbox.retry_dead(
                conn, tenant, list(retry_ids), settings.stripe_meter_unit_micros
            )
            click.echo(f"{count} row(s) back to pending, to be planned again")
            return
        rows = outbox.list_dead(conn, tenant)
    for row in rows:
        click.echo(
            f"{row.id}\t{row.tenant_id}\t{row.customer_id}\t"
            f"run {row.run_id} v{row.decision_version}\t{row.target_billed_micros} micros\t"
            f"{row.attempts} attempt(s)\t{row.last_error}"
        )
    click.echo(f"{len(rows)} dead row(s)")


@stripe.command("drift")
@click.option("--tenant", required=True)
@click.option("--customer", default=None, help="One customer; else every linked one.")
@click.option(
    "--from", "start", type=click.DateTime(), default=None, help="UTC; default --to − 1 day"
)
@click.option(
    "--to", "end", type=click.DateTime(), default=None, help="UTC, exclusive; default now"
)
def drift(tenant: str, customer: str | None, start: datetime | None, end: datetime | None) -> None:
    """Compare, per customer, the closed hours of [from, to) with Stripe's summaries, and the
    finalized invoices of periods overlapping it (their metered line less its credit notes)
    with our books and ledger. Exit 1 on any difference."""
    from metering.billing.drift import describe_hour
    from metering.billing.service import drift as hourly
    from metering.billing.service import invoice_drift, linked_customers

    settings = load_cli_settings()
    engine = create_db_engine(settings)
    until = _utc(end) if end else datetime.now(UTC)
    since = _utc(start) if start else until - timedelta(days=1)
    found = 0
    for who in [customer] if customer else linked_customers(engine, tenant):
        for d in hourly(engine, settings, tenant, who, since, until):
            found += 1
            click.echo(describe_hour(tenant, who, d))
        for invoice in invoice_drift(engine, settings, tenant, who, since, until):
            found += invoice.drifted
            click.echo(("DRIFT\t" if invoice.drifted else "ok\t") + invoice.describe())
    click.echo(f"{found} difference(s)")
    if found:
        raise SystemExit(1)
