"""``statement.closed``: a customer's statement of a month, announced once when it is final.

A statement is final when it has closed (``metering.periods.period_close``: the month's end
plus ``period_close_delay_s``; later changes go to the next month's statement) and none of
the customer's runs that ended in the month or before still waits for a decision: then its
totals are the ones the customer will be billed for that month, and nothing is in flight.

Exactly once: a row in ``statement_closings`` (primary key tenant, customer, period) is
inserted in the transaction that records the notification, and only the transaction whose
insert took records it: two beats closing at once announce it once. A statement with no
lines (no run ended or changed in the month) is not announced. Parked runs wait for support,
not for a decision the sweeper can make: they do not hold a statement back.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from sqlalchemy.engine import Engine

from metering.config import Settings
from metering.db import raw_transaction
from metering.models.events import PENDING
from metering.notifications import record_many
from metering.notifications.builders import about_customer, timestamp
from metering.notifications.catalogue import STATEMENT_CLOSED
from metering.periods import closed_periods, period_close
from metering.statements.query import Totals, totals_of
from metering.statements.totals import TOTALS_OF_SUMS

# The customers with lines on each closed statement not announced yet, and no pending run
# that ended before the month did (a run ends at its terminal event, else its last event,
# as settlement dates it), with the statement's totals. Driven by the customers, each a
# few index probes (the closings' key, ``ix_statement_lines_page``, the sums' key), not by
# a scan of every statement line of the month.
DUE_STATEMENTS = f"""
WITH periods AS (
    SELECT * FROM unnest(%(periods)s::text[], %(ends)s::timestamptz[]) AS p(period, ends_at)
),
pending AS (
    SELECT tenant_id, customer_id, min(COALESCE(terminal_at, last_event_at)) AS ended_at
    FROM runs WHERE {PENDING}
    GROUP BY tenant_id, customer_id
),
unannounced AS (
    SELECT c.tenant_id, c.id AS customer_id, p.period, p.ends_at
    FROM customers c CROSS JOIN periods p
    WHERE NOT EXISTS (
        SELECT 1 FROM statement_closings s
        WHERE s.tenant_id = c.tenant_id AND s.customer_id = c.id AND s.period = p.period
    ) AND EXISTS (
        SELECT 1 FROM statement_lines l
        WHERE l.tenant_id = c.tenant_id AND l.customer_id = c.id
          AND l.statement_period = p.period
    )
)
SELECT u.tenant_id, u.customer_id, u.period, t.*
FROM unannounced u
LEFT JOIN pending q ON q.tenant_id = u.tenant_id AND q.customer_id = u.customer_id
CROSS JOIN LATERAL (
    SELECT {TOTALS_OF_SUMS} FROM statement_totals t
    WHERE t.tenant_id = u.tenant_id AND t.customer_id = u.customer_id
      AND t.statement_period = u.period
) AS t
WHERE q.ended_at IS NULL OR q.ended_at >= u.ends_at
ORDER BY u.tenant_id, u.customer_id, u.period
"""

# ON CONFLICT DO NOTHING waits for a concurrent insert of the same statement and then
# skips it: RETURNING gives only the rows this transaction closed.
INSERT_CLOSINGS = """
INSERT INTO statement_closings (tenant_id, customer_id, period, gross_micros, billed_micros,
                                credited_micros, held_micros, runs, closed_at)
SELECT *, %(now)s::timestamptz
FROM unnest(%(tenants)s::text[], %(customers)s::text[], %(periods)s::text[],
            %(gross)s::bigint[], %(billed)s::bigint[], %(credited)s::bigint[],
            %(held)s::bigint[], %(runs)s::int[])
ON CONFLICT DO NOTHING
RETURNING tenant_id, customer_id, period
"""


@dataclass(frozen=True, slots=True)
class ClosedStatement:
    tenant_id: str
    customer_id: str
    period: str
    totals: Totals


def close_statements(
    conn: psycopg.Connection[Any], now: datetime, *, delay: timedelta, lookback: int
) -> list[ClosedStatement]:
    """Close and announce, in the caller's transaction, every final statement of the last
    ``lookback`` closed months not announced yet; the ones this call closed."""
    periods = closed_periods(now, delay, lookback)
    ends = [period_close(p, timedelta(0)) for p in periods]
    rows = conn.execute(DUE_STATEMENTS, {"periods": periods, "ends": ends}).fetchall()
    found = [ClosedStatement(r[0], r[1], r[2], totals_of(r[3:])) for r in rows]
    if not found:
        return []
    inserted = conn.execute(INSERT_CLOSINGS, _closing_params(found, now)).fetchall()
    mine = {(r[0], r[1], r[2]) for r in inserted}
    closed = [s for s in found if (s.tenant_id, s.customer_id, s.period) in mine]
    record_many(conn, [_notification(s, now) for s in closed])
    return closed


def _closing_params(found: list[ClosedStatement], now: datetime) -> dict[str, Any]:
    return {
        "now": now,
        "tenants": [s.tenant_id for s in found],
        "customers": [s.customer_id for s in found],
        "periods": [s.period for s in found],
        "gross": [s.totals.gross_micros for s in found],
        "billed": [s.totals.billed_micros for s in found],
        "credited": [s.totals.credited_micros for s in found],
        "held": [s.totals.held_micros for s in found],
        "runs": [s.totals.runs for s in found],
    }


def _notification(statement: ClosedStatement, now: datetime) -> Any:
    totals = statement.totals
    return about_customer(
        statement.tenant_id,
        statement.customer_id,
        STATEMENT_CLOSED,
        period=statement.period,
        gross_micros=totals.gross_micros,
        billed_micros=totals.billed_micros,
        credited_micros=totals.credited_micros,
        held_micros=totals.held_micros,
        runs=totals.runs,
        closed_at=timestamp(now),
    )


def close_due_statements(engine: Engine, settings: Settings, now: datetime | None = None) -> int:
    """The beat's use case: one transaction; how many statements it closed."""
    now = now or datetime.now(UTC)
    with raw_transaction(engine) as conn:
        closed = close_statements(
            conn,
            now,
            delay=timedelta(seconds=settings.period_close_delay_s),
            lookback=settings.statement_close_lookback_periods,
        )
    return len(closed)
