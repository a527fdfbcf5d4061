"""Statement lines and totals, read from the ``statement_lines`` read model.

A *run line* shows a run on the statement of the month it ended in; a *correction line* a
change made to a run after its own statement had closed, as the difference from what the
previous statement showed. Amounts are the ledger's position: a run held for review has
nothing billed or credited yet.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
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
    match = PERIOD.match(text)
    # Years 1 to 9998: the period's close (the next month) must be a datetime.
    if not match or not 1 <= int(match.group(1)) <= 9998:
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


WHERE = """
WHERE l.tenant_id = %(tenant)s AND l.customer_id = %(customer)s
  AND l.statement_period = %(period)s
  AND (%(outcome)s::text IS NULL OR l.outcome = %(outcome)s)
  AND (%(ended_from)s::timestamptz IS NULL OR l.ended_at >= %(ended_from)s)
  AND (%(ended_to)s::timestamptz IS NULL OR l.ended_at < %(ended_to)s)
"""

LINE_SELECT = f"""
SELECT l.kind, l.subject, l.version, l.started_at, l.ended_at, l.models, l.input_tokens,
       l.cached_input_tokens, l.output_tokens, l.gross_abs - l.base_gross,
       l.billed_abs - l.base_billed, l.credited_abs - l.base_credited, l.outcome, l.status,
       l.explanation, CASE WHEN l.kind = 'correction' THEN l.run_period END,
       coalesce(o.status, 'not_billed'), l.decided_at, l.run_id
FROM statement_lines l
LEFT JOIN stripe_outbox o ON o.run_id = l.run_id AND o.decision_version = l.version
{WHERE}
"""


def params(query: StatementQuery) -> dict[str, Any]:
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
    values = params(query) | {
        "after_ended": after[0] if after else None,
        "after_run": after[1] if after else None,
        "limit": limit,
    }
    rows = conn.execute(
        LINE_SELECT + " AND (%(after_ended)s::timestamptz IS NULL"
        "      OR (l.ended_at, l.run_id) > (%(after_ended)s, %(after_run)s))"
        " ORDER BY l.ended_at, l.run_id LIMIT %(limit)s",
        values,
    ).fetchall()
    return [_line(r) for r in rows]


def stream(conn: psycopg.Connection[Any], query: StatementQuery) -> Iterator[StatementLine]:
    """Every line, through a server-side cursor: memory stays flat for any statement size."""
    with conn.cursor(name="statement_lines") as cursor:
        cursor.itersize = 2000
        cursor.execute(LINE_SELECT + " ORDER BY l.ended_at, l.run_id", params(query))
        for row in cursor:
            yield _line(row)


# A statement's totals over its lines ``l`` (``totals_of`` reads a row of them): what the
# statement page shows and what ``statement.closed`` announces. Summed over the lines only
# for a filter that is not whole days; ``totals.py`` reads the sums settlement keeps.
TOTALS_COLUMNS = """
coalesce(sum(l.gross_abs - l.base_gross), 0),
coalesce(sum(l.billed_abs - l.base_billed), 0),
coalesce(sum(l.credited_abs - l.base_credited), 0),
count(*) FILTER (WHERE l.kind = 'run'),
count(*) FILTER (WHERE l.kind = 'run' AND l.outcome = 'refunded'),
count(*) FILTER (WHERE l.kind = 'correction')
"""


TOTALS_OF_LINES = f"SELECT {TOTALS_COLUMNS} FROM statement_lines l {WHERE}"


def totals_of(row: Sequence[Any]) -> Totals:
    """Totals from a row of ``TOTALS_COLUMNS`` or of ``totals.TOTALS_OF_SUMS`` (same
    order)."""
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


def daily_of_lines(
    conn: psycopg.Connection[Any], query: StatementQuery
) -> list[tuple[date, int, int]]:
    """(day, billed, restored) per day — a run's end, or a correction's decision — for the
    chart, summed over the lines (``totals.daily`` reads the kept sums)."""
    rows = conn.execute(
        f"""
        SELECT ((CASE WHEN l.kind = 'correction' THEN l.decided_at ELSE l.ended_at END)
                AT TIME ZONE 'UTC')::date,
               sum(l.billed_abs - l.base_billed), sum(l.credited_abs - l.base_credited)
        FROM statement_lines l {WHERE}
        GROUP BY 1 ORDER BY 1
        """,
        params(query),
    ).fetchall()
    return [(r[0], int(r[1]), int(r[2])) for r in rows]
