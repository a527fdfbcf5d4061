"""A statement's totals and daily chart, from ``statement_totals``: sums kept by settlement.

Summing a customer's lines on every page view grows with the customer: 121 ms at 100,000
runs in a month (docs/benchmarks.md, "Growth"). Settlement already writes each line in the
transaction that decides the run, so it keeps the sums there too, as the new line minus the
old one (a re-decided line replaces its previous version; the old one is read in the same
statement, before the upsert, under the run's and the customer's locks). A statement then
reads one row per kind, outcome and day: a few dozen, whatever the customer's size.

The sums are keyed by what a statement filters and charts on, and nothing else: the line's
kind and outcome, the day its run ended (the page's ``ended_from``/``ended_to`` are whole
UTC days) and the day it is charted on (a run's end; a correction's decision). A filter that
is not whole days is summed over the lines, as before.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time
from typing import Any

import psycopg

from metering.statements import query
from metering.statements.query import StatementQuery, Totals, totals_of

# The totals key and the sums of one statement line ``l``, signed.
_KEY = """l.tenant_id, l.customer_id, l.statement_period, l.kind, l.outcome,
       (l.ended_at AT TIME ZONE 'UTC')::date,
       ((CASE WHEN l.kind = 'correction' THEN l.decided_at ELSE l.ended_at END)
        AT TIME ZONE 'UTC')::date"""


def _signed(sign: str) -> str:
    """The line's key and its sums, negated with ``sign="-"`` (the version it replaces)."""
    return f"""{_KEY},
       {sign}(l.gross_abs - l.base_gross), {sign}(l.billed_abs - l.base_billed),
       {sign}(l.credited_abs - l.base_credited), {sign}1"""


COLUMNS = """tenant_id, customer_id, statement_period, kind, outcome, ended_on, charted_on,
    gross_micros, billed_micros, credited_micros, lines"""
_KEY_COLUMNS = "tenant_id, customer_id, statement_period, kind, outcome, ended_on, charted_on"

# Appended to the statement that upserts lines (``projection.UPSERT_LINES``): ``old`` holds
# the lines as they were before it, ``new`` the lines it wrote. Sums are locked in key
# order, so two transactions touching the same ones cannot deadlock on them (settlement
# holds the customer's lock anyway).
ADD_CHANGES = f"""
, changed ({COLUMNS}) AS (
    SELECT {_signed("")} FROM new l
    UNION ALL
    SELECT {_signed("-")} FROM old l
)
INSERT INTO statement_totals AS t ({COLUMNS})
SELECT {_KEY_COLUMNS}, sum(gross_micros), sum(billed_micros), sum(credited_micros), sum(lines)
FROM changed
GROUP BY {_KEY_COLUMNS}
HAVING (sum(gross_micros), sum(billed_micros), sum(credited_micros), sum(lines)) <> (0, 0, 0, 0)
ORDER BY {_KEY_COLUMNS}
ON CONFLICT ({_KEY_COLUMNS})
DO UPDATE SET gross_micros = t.gross_micros + EXCLUDED.gross_micros,
              billed_micros = t.billed_micros + EXCLUDED.billed_micros,
              credited_micros = t.credited_micros + EXCLUDED.credited_micros,
              lines = t.lines + EXCLUDED.lines
"""

# The sums of a tenant's lines written some other way than settlement (bulk loaders).
_REBUILD = f"""
INSERT INTO statement_totals ({COLUMNS})
SELECT {_KEY}, sum(l.gross_abs - l.base_gross), sum(l.billed_abs - l.base_billed),
       sum(l.credited_abs - l.base_credited), count(*)
FROM statement_lines l WHERE l.tenant_id = %(tenant)s
GROUP BY 1, 2, 3, 4, 5, 6, 7
"""

TOTALS_OF_SUMS = """
coalesce(sum(t.gross_micros), 0), coalesce(sum(t.billed_micros), 0),
coalesce(sum(t.credited_micros), 0),
coalesce(sum(t.lines) FILTER (WHERE t.kind = 'run'), 0),
coalesce(sum(t.lines) FILTER (WHERE t.kind = 'run' AND t.outcome = 'refunded'), 0),
coalesce(sum(t.lines) FILTER (WHERE t.kind = 'correction'), 0)
"""

_SUMS_WHERE = """
WHERE t.tenant_id = %(tenant)s AND t.customer_id = %(customer)s
  AND t.statement_period = %(period)s
  AND (%(outcome)s::text IS NULL OR t.outcome = %(outcome)s)
  AND (%(ended_from)s::date IS NULL OR t.ended_on >= %(ended_from)s)
  AND (%(ended_to)s::date IS NULL OR t.ended_on < %(ended_to)s)
"""


def rebuild(conn: psycopg.Connection[Any], tenant_id: str) -> None:
    """The tenant's sums made again from its lines, in the caller's transaction."""
    conn.execute("DELETE FROM statement_totals WHERE tenant_id = %(tenant)s", {"tenant": tenant_id})
    conn.execute(_REBUILD, {"tenant": tenant_id})


def _whole_day(moment: datetime | None) -> bool:
    return moment is None or moment.astimezone(UTC).time() == time(0)


def _day_params(statement: StatementQuery) -> dict[str, Any] | None:
    """The statement's parameters over the sums; None when its filter is not whole UTC
    days."""
    ends = {"ended_from": statement.ended_from, "ended_to": statement.ended_to}
    if not all(_whole_day(moment) for moment in ends.values()):
        return None
    days = {
        name: moment.astimezone(UTC).date() if moment else None for name, moment in ends.items()
    }
    return query.params(statement) | days


def totals_sql(statement: StatementQuery) -> tuple[str, dict[str, Any]]:
    """The query of the statement's totals and its parameters: over the sums when the
    filter is whole days, else over the lines."""
    params = _day_params(statement)
    if params is None:
        return query.TOTALS_OF_LINES, query.params(statement)
    return f"SELECT {TOTALS_OF_SUMS} FROM statement_totals t {_SUMS_WHERE}", params


def totals(conn: psycopg.Connection[Any], statement: StatementQuery) -> Totals:
    row = conn.execute(*totals_sql(statement)).fetchone()
    assert row is not None
    return totals_of(row)


def daily(conn: psycopg.Connection[Any], statement: StatementQuery) -> list[tuple[date, int, int]]:
    """(day, billed, restored) per day with lines — a run's end, or a correction's
    decision — for the chart."""
    params = _day_params(statement)
    if params is None:
        return query.daily_of_lines(conn, statement)
    rows = conn.execute(
        f"""
        SELECT t.charted_on, sum(t.billed_micros), sum(t.credited_micros)
        FROM statement_totals t {_SUMS_WHERE}
        GROUP BY 1 HAVING sum(t.lines) <> 0 ORDER BY 1
        """,
        params,
    ).fetchall()
    return [(r[0], int(r[1]), int(r[2])) for r in rows]
