"""``fairmeter archive``: old months to Parquet and back (issue #18, docs/scaling.md
"Archive and retention")."""

from __future__ import annotations

from datetime import UTC, datetime

import click

from metering.config import load_cli_settings
from metering.history.archive import (
    ArchiveError,
    archive_engine,
    archive_history,
    archive_listing,
    restore_month,
)
from metering.history.archive_plan import PeriodError, parse_period, period_label


@click.group()
def archive() -> None:
    """Archive months past retention to Parquet files; list them; restore one for an audit."""


@archive.command("run")
def archive_run() -> None:
    """Archive now what the beat would: every month past retention that can leave."""
    settings = load_cli_settings()
    report = archive_history(archive_engine(settings), settings, datetime.now(UTC))
    if report.busy:
        raise click.ClickException("another archive run is under way; nothing done")
    for o in report.outcomes:
        rows = f", {o.rows} row(s)" if o.rows else ""
        detail = f": {o.detail}" if o.detail else ""
        click.echo(f"{o.table} {o.period} {o.outcome}{rows}{detail}")
    if settings.archive_url is None and report.outcomes:
        click.echo(
            f"warning: {len(report.outcomes)} month(s) past retention wait in the database; "
            "set FAIRMETER_ARCHIVE_URL to archive them",
            err=True,
        )
    click.echo(
        f"{report.count('archived')} archived, {report.count('held')} held by unsettled runs, "
        f"{report.count('failed')} failed, {report.count('waiting')} waiting"
    )
    if report.count("failed"):
        raise SystemExit(1)


@archive.command("list")
def archive_list() -> None:
    """Months in the archive, and months past retention still in the database."""
    settings = load_cli_settings()
    listing = archive_listing(archive_engine(settings), settings, datetime.now(UTC))
    # An empty heading says "none": a blank under it reads like output that went missing.
    click.echo("archived:" + ("" if listing.archived else " none"))
    for a in listing.archived:
        state = f"restored {a.restored_at:%Y-%m-%d %H:%M}" if a.restored_at else "archived"
        click.echo(f"  {a.table} {period_label(a.month)} {a.rows} row(s) {state} {a.url}")
    click.echo("past retention, in the database:" + ("" if listing.waiting else " none"))
    for w in listing.waiting:
        click.echo(f"  {w.table} {w.period} {w.rows} row(s) {w.outcome}")


@archive.command("restore")
@click.argument("period")
@click.option("--table", default="events", show_default=True, help="The monthly table.")
def archive_restore(period: str, table: str) -> None:
    """Bring PERIOD (YYYY-MM) of a table back from the archive, every row as it was."""
    settings = load_cli_settings()
    try:
        month = parse_period(period)
        record = restore_month(archive_engine(settings), settings, table, month, datetime.now(UTC))
    except (PeriodError, ArchiveError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{table} {period_label(month)} restored: {record.rows} row(s) from {record.url}")
