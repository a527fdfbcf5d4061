"""Celery tasks: each a few lines that call a use case in ``metering``.

Messages are sent only after the transaction that produced their work committed, and every
task re-checks the database, so a lost or duplicated message only delays work.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from celery import Task

from metering.billing import service as billing
from metering.db import raw_transaction
from metering.history.archive import archive_engine, archive_history
from metering.history.partitions import ensure_month_partitions
from metering.settlement.runner import claim_due_chunks, now_utc, settle_chunk
from metering.statements.closing import close_due_statements
from metering.webhooks.delivery import deliver_in_turn
from metering.webhooks.fanout import fan_out_pending
from reconciler.celery_app import app
from reconciler.engine import engine, pusher, redis_client, settings, webhook_sender
from reconciler.kicks import kick_once, started

log = logging.getLogger("fairmeter.tasks")


@app.task(name="fairmeter.ping")
def ping() -> str:
    """Liveness probe for workers."""
    return "pong"


@app.task(name="fairmeter.sweep_due_runs")
def sweep_due_runs() -> int:
    """Beat, every few seconds: claim due runs (committed), then hand out chunks."""
    chunks = claim_due_chunks(engine(), settings())
    for chunk in chunks:
        settle_run_chunk.delay(chunk)
    return len(chunks)


@app.task(name="fairmeter.settle_run_chunk")
def settle_run_chunk(run_ids: list[int]) -> int:
    report = settle_chunk(engine(), settings(), run_ids)
    if report.records and settings().stripe_enabled:
        push_stripe_outbox.delay()  # sent after the settlement committed
    if report.decided:
        kick(fan_out_webhooks)  # its notifications, at once
    return len(report.decided)


@app.task(name="fairmeter.push_stripe_outbox")
def push_stripe_outbox() -> int:
    """Beat and after settlement: drain due outbox rows to Stripe."""
    if not settings().stripe_enabled:
        return 0
    return pusher().push_due().sent_rows


@app.task(name="fairmeter.handle_stripe_webhooks")
def handle_stripe_webhooks() -> int:
    return billing.handle_webhooks(engine(), settings())


@app.task(name="fairmeter.close_statements")
def close_statements() -> int:
    """Beat: announce each customer's statement once it is final (``statement.closed``)."""
    return close_due_statements(engine(), settings())


@app.task(name="fairmeter.ensure_partitions")
def ensure_partitions() -> int:
    """Hourly: this month's and the next months' partitions of the monthly tables; a month
    its table's default partition blocks is an error for an operator (its rows are safe)."""
    with raw_transaction(engine()) as conn:
        made = ensure_month_partitions(conn, datetime.now(UTC), settings().partitions_ahead_months)
    for blocked in (m for m in made if m.outcome == "blocked"):
        log.error(
            "partition blocked: the default partition holds rows of its month; move them",
            extra={"table": blocked.table, "partition": blocked.partition},
        )
    return sum(m.outcome == "created" for m in made)


# An archive run reads and writes whole months: far longer than the default limits. A
# redelivered or second run finds the advisory lock taken and returns at once.
# Acknowledged when it starts, unlike the other tasks: RabbitMQ closes a channel whose
# delivery stays unacknowledged past its consumer_timeout (30 minutes by default), and a
# month can take hours. Nothing is lost if its worker dies: the month stays in the database
# until its file is verified, and the next daily run finishes it.
@app.task(
    name="fairmeter.archive_history",
    soft_time_limit=6 * 3600,
    time_limit=6 * 3600 + 60,
    acks_late=False,
)
def archive_history_task() -> int:
    """Daily: archive the months past retention (metering/history/archive.py)."""
    archive_db = archive_engine(settings())  # as the tables' owner, when configured
    try:
        report = archive_history(archive_db, settings(), datetime.now(UTC))
    finally:
        archive_db.dispose()
    for o in report.outcomes:
        log.log(
            ARCHIVE_LOG_LEVELS[o.outcome],
            f"archive: {o.table} {o.period} {o.outcome}",
            extra={"table": o.table, "month": o.period, "rows": o.rows, "detail": o.detail},
        )
    if waiting := report.count("waiting"):
        log.warning("%d month(s) past retention wait: set FAIRMETER_ARCHIVE_URL", waiting)
    return report.count("archived")


ARCHIVE_LOG_LEVELS = {
    "archived": logging.INFO,
    "held": logging.WARNING,
    "waiting": logging.INFO,
    "failed": logging.ERROR,
    "restored": logging.INFO,
}


@app.task(name="fairmeter.check_stripe_drift")
def check_stripe_drift() -> int:
    """Hourly: the last day's closed hours vs Stripe's summaries, and newly finalized
    invoices and their credit notes vs our books; each difference logged as the CLI prints
    it (``fairmeter stripe drift``)."""
    if not settings().stripe_enabled:
        return 0
    found = billing.recent_drift(engine(), settings(), datetime.now(UTC))
    for line in found:
        log.error("stripe drift: %s", line, extra={"drift": line})
    return len(found)


def kick(task: Task) -> None:
    """Send ``task`` at once unless a kick of it is already waiting (reconciler/kicks.py)."""
    kick_once(redis_client(), task.name, lambda expires_s: task.apply_async(expires=expires_s))


@app.task(name="fairmeter.fan_out_webhooks")
def fan_out_webhooks() -> int:
    """Beat, and right after a settlement: new notifications → webhook messages, whose
    delivery is kicked at once (sub-second, not at the next beat)."""
    started(redis_client(), fan_out_webhooks.name)
    created = fan_out_pending(engine(), settings(), now_utc)
    if created:
        kick(deliver_webhooks)
    return created


@app.task(name="fairmeter.deliver_webhooks")
def deliver_webhooks() -> int:
    """Beat, and after a fan-out: send due webhook messages, outside any transaction, in
    the one delivery round running (or leave at once: that round takes them); a round that
    ends with more due kicks the next."""
    started(redis_client(), deliver_webhooks.name)
    done = deliver_in_turn(engine(), settings(), webhook_sender(), now_utc)
    if done.more_due:
        kick(deliver_webhooks)
    return done.sent
