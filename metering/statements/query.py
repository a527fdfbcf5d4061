"""Statement lines and totals, read from decisions by their statement period.

A *run line* is the last decision version a run got on this statement; a *correction line*
is a change to a run of an earlier, already closed statement, shown as the difference from
what that statement (or the last one after it) showed. Amounts are the ledger's position:
a run held for review has nothing billed or credited yet.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any

import psycopg

from metering.errors import FieldError, validation_error
from metering.policy import OUTCOMES

PERIOD = re.compile(r"^(\d{4})-(0[1-9]|1[0-2])$")


@dataclass(frozen=True, slots=True)
class StatementQuery:
    tenant_id: str
    customer_id: str
    period: str
    outcome: str | None = None
    ended_from: datetime | None = None
    ended_to: datetime | None = None


@dataclass(frozen=True, slots=True)
class StatementLine:
    kind: str  # "run" | "correction"
    run: str
    version: int
    started_at: datetime
    ended_at: datetime
    models: list[str]
    input_tokens: int
    cached_input_tokens: int
    output_tokens: int
    gross_micros: int
    billed_micros: int
    credited_micros: int
    outcome: str
    status: str
    explanation: str
    corrects_period: str | None
    stripe: str
    decided_at: datetime
    run_id: int

    @property
    def interrupted(self) -> bool:
        return self.credited_micros > 0 or self.outcome == "held_for_review"


@dataclass(frozen=True, slots=True)
class Totals:
    gross_micros: int
    billed_micros: int
    credited_micros: int
    held_micros: int
    runs: int
    runs_restored: int
    corrections: int


def parse_period(text: str, now: datetime) -> str:
    if text == "current":
        return now.astimezone(UTC).strftime("%Y-%m")
    if not PERIOD.match(text):
        raise validation_error(
            [FieldError("$.period", "invalid_period", "period is YYYY-MM or 'current'")]
        )
    return text


def check_outcome(outcome: str | None) -> str | None:
    if outcome is not None and outcome not in OUTCOMES:
        raise validation_error(
            [FieldError("$.outcome", "invalid_value", f"outcome is one of {', '.join(OUTCOMES)}")]
        )
    return outcome


# The decision in force on this statement for each run, its predecessor on earlier
# statements (for corrections), and the position both left in the ledger.
LINES_SQL = """
WITH in_force AS (
    SELECT DISTINCT ON (d.run_id) d.*
    FROM decisions d
    WHERE d.tenant_id = %(tenant)s AND d.customer_id = %(customer)s
      AND d.statement_period = %(period)s
    ORDER BY d.run_id, d.version DESC
), lines AS (
    SELECT f.*, r.subject,
           CASE WHEN f.period = %(period)s THEN 'run' ELSE 'correction' END AS kind,
           prev.gross_micros AS prev_gross,
           CASE WHEN prev.outcome = 'held_for_review' THEN 0 ELSE prev.billed_micros END
               AS prev_billed,
           CASE WHEN prev.outcome = 'held_for_review' THEN 0 ELSE prev.credited_micros END
               AS prev_credited,
           (SELECT o.status FROM stripe_outbox o
             WHERE o.run_id = f.run_id AND o.decision_version = f.version) AS stripe_status
    FROM in_force f
    JOIN runs r ON r.id = f.run_id
    LEFT JOIN LATERAL (
        SELECT p.* FROM decisions p
        WHERE f.period <> %(period)s AND p.run_id = f.run_id AND p.version < f.version
          AND p.statement_period <> %(period)s
        ORDER BY p.version DESC LIMIT 1
    ) prev ON true
    WHERE (%(outcome)s::text IS NULL OR f.outcome = %(outcome)s)
      AND (%(ended_from)s::timestamptz IS NULL OR f.ended_at >= %(ended_from)s)
      AND (%(ended_to)s::timestamptz IS NULL OR f.ended_at < %(ended_to)s)
)
"""

LINE_COLUMNS = """
    kind, subject, version, started_at, ended_at, models, input_tokens, cached_input_tokens,
    output_tokens,
    gross_micros - coalesce(prev_gross, 0),
    (CASE WHEN outcome = 'held_for_review' THEN 0 ELSE billed_micros END)
        - coalesce(prev_billed, 0),
    (CASE WHEN outcome = 'held_for_review' THEN 0 ELSE credited_micros END)
        - coalesce(prev_credited, 0),
    outcome, status, explanation,
    CASE WHEN kind = 'correction' THEN period END,
    coalesce(stripe_status, 'not_billed'), decided_at, run_id
"""


def _params(query: StatementQuery) -> dict[str, Any]:
    return {
        "tenant": query.tenant_id,
        "customer": query.customer_id,
        "period": query.period,
        "outcome": query.outcome,
        "ended_from": query.ended_from,
        "ended_to": query.ended_to,
    }


def _line(row: tuple[Any, ...]) -> StatementLine:
    values = list(row)
    values[5] = list(values[5])
    return StatementLine(*values)


def page(
    conn: psycopg.Connection[Any],
    query: StatementQuery,
    *,
    after: tuple[datetime, int] | None,
    limit: int,
) -> list[StatementLine]:
    """Lines in (end time, run) order, after the cursor, at most ``limit``."""
    params = _params(query) | {
        "after_ended": after[0] if after else None,
        "after_run": after[1] if after else None,
        "limit": limit,
    }
    rows = conn.execute(
        LINES_SQL + f"SELECT {LINE_COLUMNS} FROM lines "
        "WHERE %(after_ended)s::timestamptz IS NULL "
        "   OR (ended_at, run_id) > (%(after_ended)s, %(after_run)s) "
        "ORDER BY ended_at, run_id LIMIT %(limit)s",
        params,
    ).fetchall()
    return [_line(r) for r in rows]


def stream(conn: psycopg.Connection[Any], query: StatementQuery) -> Iterator[StatementLine]:
    """Every line, through a server-side cursor: memory stays flat for any statement size."""
    with conn.cursor(name="statement_lines") as cursor:
        cursor.itersize = 2000
        cursor.execute(
            LINES_SQL + f"SELECT {LINE_COLUMNS} FROM lines ORDER BY ended_at, run_id",
            _params(query),
        )
        for row in cursor:
            yield _line(row)


def totals(conn: psycopg.Connection[Any], query: StatementQuery) -> Totals:
    row = conn.execute(
        LINES_SQL
        + f"""
        , amounts AS (SELECT {LINE_COLUMNS} FROM lines)
        SELECT coalesce(sum(a.gross), 0), coalesce(sum(a.billed), 0),
               coalesce(sum(a.credited), 0),
               count(*) FILTER (WHERE a.kind = 'run'),
               count(*) FILTER (WHERE a.kind = 'run' AND a.outcome = 'refunded'),
               count(*) FILTER (WHERE a.kind = 'correction')
        FROM amounts AS a(kind, subject, version, started_at, ended_at, models, input_tokens,
                          cached_input_tokens, output_tokens, gross, billed, credited, outcome,
                          status, explanation, corrects_period, stripe, decided_at, run_id)
        """,
        _params(query),
    ).fetchone()
    assert row is not None
    gross, billed, credited, runs, restored, corrections = (int(v) for v in row)
    return Totals(
        gross_micros=gross,
        billed_micros=billed,
        credited_micros=credited,
        held_micros=gross - billed - credited,
        runs=runs,
        runs_restored=restored,
        corrections=corrections,
    )


def daily(conn: psycopg.Connection[Any], query: StatementQuery) -> list[tuple[date, int, int]]:
    """(day, billed, restored) per day — a run's end, or a correction's decision — for the
    chart."""
    rows = conn.execute(
        LINES_SQL
        + f"""
        , amounts AS (SELECT {LINE_COLUMNS} FROM lines)
        SELECT ((CASE WHEN a.kind = 'correction' THEN a.decided_at ELSE a.ended_at END)
                AT TIME ZONE 'UTC')::date,
               sum(a.billed), sum(a.credited)
        FROM amounts AS a(kind, subject, version, started_at, ended_at, models, input_tokens,
                          cached_input_tokens, output_tokens, gross, billed, credited, outcome,
                          status, explanation, corrects_period, stripe, decided_at, run_id)
        GROUP BY 1 ORDER BY 1
        """,
        _params(query),
    ).fetchall()
    return [(r[0], int(r[1]), int(r[2])) for r in rows]
