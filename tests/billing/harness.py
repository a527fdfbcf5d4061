"""What the billing tests share besides fixtures: settled runs to push, and a bounded drain."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from metering.billing.push import Pusher, PushReport
from metering.config import Settings
from metering.db import raw_transaction
from metering.settlement.runner import settle_due_now
from tests.helpers.ingest import ingest
from tests.helpers.scenarios import scenario


def drain(pusher: Pusher, engine: Any, deadline_s: float = 120) -> list[PushReport]:
    """Push until no row is pending (bounded); returns each round's report."""
    reports = []
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        reports.append(pusher.push_due())
        with raw_transaction(engine) as conn:
            (pending,) = conn.execute(
                "SELECT count(*) FROM stripe_outbox WHERE status = 'pending'"
            ).fetchone() or (0,)
        if pending == 0:
            return reports
        time.sleep(0.05)
    with raw_transaction(engine) as conn:
        stuck = conn.execute(
            "SELECT id, next_step, attempts, last_error FROM stripe_outbox "
            "WHERE status = 'pending' ORDER BY id LIMIT 5"
        ).fetchall()
    raise TimeoutError(f"outbox still has pending rows: {stuck}")


def settled_runs(
    engine: Any,
    settings: Settings,
    runs: int,
    customers: int,
    kinds: tuple[str, ...] = ("completed", "partial-delivery", "user-cancel"),
    start: datetime | None = None,
) -> None:
    """``runs`` runs of ``kinds`` in turn over ``customers`` customers, ingested and settled
    through the use cases (devtools/bulk.py writes settled rows in SQL instead, for volume)."""
    start = start or datetime.now(UTC) - timedelta(hours=2)
    batch: list[dict[str, Any]] = []
    for i in range(runs):
        batch += scenario(kinds[i % len(kinds)], f"run-{i}", f"cust-{i % customers}", start)
        if len(batch) >= 900:
            ingest(engine, settings, batch)
            batch = []
    if batch:
        ingest(engine, settings, batch)
    settle_due_now(engine, settings, now=datetime.now(UTC))
