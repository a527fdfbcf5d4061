"""A tenant's month of mixed runs, settled for real, with the figures the report must show.

Every usage line is agent-small-1 with 1,000 input and 500 output tokens: 875 micros billed
(250 + 625) and 525 micros of provider cost (150 + 375) by tests/helpers/{prices,
provider_costs}.csv.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from metering.periods import period_of
from metering.settlement.runner import settle_due_now
from tests.helpers.events import event, usage
from tests.helpers.ingest import ingest
from tests.helpers.scenarios import scenario

LINE_GROSS = 875
LINE_COST = 525
NOW = datetime.now(UTC).replace(microsecond=0)
START = NOW - timedelta(hours=3)
PERIOD = period_of(START + timedelta(minutes=4))


def duplicate_then_drop(run: str, customer: str) -> list[dict[str, Any]]:
    """R1 credits the repeated tool call; R4 then refunds the rest (a server drop)."""

    def at(minutes: float) -> datetime:
        return START + timedelta(minutes=minutes)

    def u(step: int, minute: float, **data: Any) -> dict[str, Any]:
        return usage(
            run=run, customer=customer, step=step, time=at(minute), model="agent-small-1", **data
        )

    def e(type_: str, minute: float, **data: Any) -> dict[str, Any]:
        return event(type=type_, run=run, customer=customer, time=at(minute), **data)

    return [
        e("run.started", 0, attempt=1),
        u(1, 1, tool_call_id="tc-1"),
        e("run.tool_call", 1.5, tool_call_id="tc-1", step=1, status="completed"),
        u(2, 2, tool_call_id="tc-1"),
        u(3, 2.5),
        e("connection.lost", 3, side="server"),
        e("run.failed", 4, cause="network"),
    ]


def settle_month(engine: Any, settings: Any, *, tenant: str = "acme") -> None:
    """cust-1: confirmed, refunded (R4, 2 lines), partial (R5, 2 of 3 lines), held (2 lines);
    cust-2: R1 + R4 (1 line R1, 2 lines R4) and a confirmed run support credits in full."""
    events = (
        scenario("completed", "ok-run", "cust-1", START)
        + scenario("server-drop", "drop-run", "cust-1", START)
        + scenario("partial-delivery", "partial-run", "cust-1", START)
        + scenario("client-claim", "held-run", "cust-1", START)
        + duplicate_then_drop("dup-run", "cust-2")
        + scenario("completed", "credited-run", "cust-2", START)
    )
    ingest(engine, settings, events, tenant=tenant)
    settle_due_now(engine, settings, now=NOW)
