"""Keeping the statement read model (``statement_lines`` and the sums over them,
``statement_totals``) in step with new decisions.

Called in the same transaction that writes the decisions, so a statement never shows a
decision the ledger does not have, or misses one it has.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import msgspec
import psycopg

from metering.statements.totals import ADD_CHANGES


@dataclass(frozen=True, slots=True)
class LineChange:
    """What one new decision version puts on its statement."""

    run_id: int
    tenant_id: str
    customer_id: str
    statement_period: str
    run_period: str
    version: int
    started_at: datetime
    ended_at: datetime
    models: tuple[str, ...]
    input_tokens: int
    cached_input_tokens: int
    output_tokens: int
    gross_micros: int
    billed_micros: int  # the ledger position: zero for a held run
    credited_micros: int
    outcome: str
    status: str
    explanation: str


# ``old``: the lines this replaces, read before the upsert (the run's lock keeps them);
# ``new``: the lines as written. ``totals.ADD_CHANGES`` adds new minus old to the sums.
UPSERT_LINES = (
    """
WITH u AS (
    SELECT * FROM json_to_recordset(%(changes)s::json)
        AS u(run_id bigint, statement_period text, tenant_id text, customer_id text,
             run_period text, version int, started_at timestamptz, ended_at timestamptz,
             models text[], input_tokens bigint, cached_input_tokens bigint,
             output_tokens bigint, gross_micros bigint, billed_micros bigint,
             credited_micros bigint, outcome text, status text, explanation text)
), old AS (
    SELECT l.* FROM statement_lines l
    JOIN u ON l.tenant_id = u.tenant_id AND l.run_id = u.run_id
          AND l.statement_period = u.statement_period
), new AS (
    INSERT INTO statement_lines (run_id, statement_period, tenant_id, customer_id, subject,
        kind, run_period, version, started_at, ended_at, decided_at, models, input_tokens,
        cached_input_tokens, output_tokens, gross_abs, billed_abs, credited_abs, base_gross,
        base_billed, base_credited, outcome, status, explanation)
    SELECT u.run_id, u.statement_period, u.tenant_id, u.customer_id, r.subject,
           CASE WHEN u.statement_period = u.run_period THEN 'run' ELSE 'correction' END,
           u.run_period, u.version, u.started_at, u.ended_at, %(now)s, u.models,
           u.input_tokens, u.cached_input_tokens, u.output_tokens, u.gross_micros,
           u.billed_micros, u.credited_micros,
           coalesce(prev.gross_abs, 0), coalesce(prev.billed_abs, 0),
           coalesce(prev.credited_abs, 0), u.outcome, u.status, u.explanation
    FROM u
    JOIN runs r ON r.tenant_id = u.tenant_id AND r.id = u.run_id
    LEFT JOIN LATERAL (
        SELECT p.gross_abs, p.billed_abs, p.credited_abs FROM statement_lines p
        WHERE p.tenant_id = u.tenant_id AND p.run_id = u.run_id
          AND p.statement_period < u.statement_period
        ORDER BY p.statement_period DESC LIMIT 1
    ) prev ON u.statement_period <> u.run_period
    ON CONFLICT (tenant_id, run_id, statement_period) DO UPDATE SET
        version = EXCLUDED.version, started_at = EXCLUDED.started_at,
        ended_at = EXCLUDED.ended_at, decided_at = EXCLUDED.decided_at,
        models = EXCLUDED.models, input_tokens = EXCLUDED.input_tokens,
        cached_input_tokens = EXCLUDED.cached_input_tokens,
        output_tokens = EXCLUDED.output_tokens, gross_abs = EXCLUDED.gross_abs,
        billed_abs = EXCLUDED.billed_abs, credited_abs = EXCLUDED.credited_abs,
        outcome = EXCLUDED.outcome, status = EXCLUDED.status,
        explanation = EXCLUDED.explanation
    RETURNING *
)"""
    + ADD_CHANGES
)


def record_lines(
    conn: psycopg.Connection[Any], changes: Sequence[LineChange], now: datetime
) -> None:
    if not changes:
        return
    # One JSON document for the chunk (as ``repo.mark_settled`` sends its rows): psycopg
    # builds array parameters element by element in Python, msgspec encodes this in C.
    conn.execute(UPSERT_LINES, {"now": now, "changes": msgspec.json.encode(changes).decode()})
