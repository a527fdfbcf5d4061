"""Keeping the statement read model (``statement_lines``) in step with new decisions.

Called in the same transaction that writes the decisions, so a statement never shows a
decision the ledger does not have, or misses one it has.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

MODEL_SEPARATOR = "\x1f"  # model names are free text; this byte never appears in them


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


UPSERT_LINES = """
INSERT INTO statement_lines (run_id, statement_period, tenant_id, customer_id, subject, kind,
    run_period, version, started_at, ended_at, decided_at, models, input_tokens,
    cached_input_tokens, output_tokens, gross_abs, billed_abs, credited_abs, base_gross,
    base_billed, base_credited, outcome, status, explanation)
SELECT u.run_id, u.sp, u.tenant, u.customer, r.subject,
       CASE WHEN u.sp = u.rp THEN 'run' ELSE 'correction' END, u.rp, u.version, u.started,
       u.ended, %(now)s, string_to_array(u.models, %(sep)s), u.tin, u.tcached, u.tout,
       u.gross, u.billed, u.credited,
       coalesce(prev.gross_abs, 0), coalesce(prev.billed_abs, 0), coalesce(prev.credited_abs, 0),
       u.outcome, u.status, u.explanation
FROM unnest(%(runs)s::bigint[], %(sps)s::text[], %(tenants)s::text[], %(customers)s::text[],
            %(rps)s::text[], %(versions)s::int[], %(started)s::timestamptz[],
            %(ended)s::timestamptz[], %(models)s::text[], %(tin)s::bigint[],
            %(tcached)s::bigint[], %(tout)s::bigint[], %(gross)s::bigint[],
            %(billed)s::bigint[], %(credited)s::bigint[], %(outcomes)s::text[],
            %(statuses)s::text[], %(explanations)s::text[])
     AS u(run_id, sp, tenant, customer, rp, version, started, ended, models, tin, tcached, tout,
          gross, billed, credited, outcome, status, explanation)
JOIN runs r ON r.id = u.run_id
LEFT JOIN LATERAL (
    SELECT p.gross_abs, p.billed_abs, p.credited_abs FROM statement_lines p
    WHERE p.run_id = u.run_id AND p.statement_period < u.sp
    ORDER BY p.statement_period DESC LIMIT 1
) prev ON u.sp <> u.rp
ON CONFLICT (run_id, statement_period) DO UPDATE SET
    version = EXCLUDED.version, started_at = EXCLUDED.started_at, ended_at = EXCLUDED.ended_at,
    decided_at = EXCLUDED.decided_at, models = EXCLUDED.models,
    input_tokens = EXCLUDED.input_tokens, cached_input_tokens = EXCLUDED.cached_input_tokens,
    output_tokens = EXCLUDED.output_tokens, gross_abs = EXCLUDED.gross_abs,
    billed_abs = EXCLUDED.billed_abs, credited_abs = EXCLUDED.credited_abs,
    outcome = EXCLUDED.outcome, status = EXCLUDED.status, explanation = EXCLUDED.explanation
"""


def record_lines(
    conn: psycopg.Connection[Any], changes: Sequence[LineChange], now: datetime
) -> None:
    if not changes:
        return
    conn.execute(
        UPSERT_LINES,
        {
            "now": now,
            "sep": MODEL_SEPARATOR,
            "runs": [c.run_id for c in changes],
            "sps": [c.statement_period for c in changes],
            "tenants": [c.tenant_id for c in changes],
            "customers": [c.customer_id for c in changes],
            "rps": [c.run_period for c in changes],
            "versions": [c.version for c in changes],
            "started": [c.started_at for c in changes],
            "ended": [c.ended_at for c in changes],
            "models": [MODEL_SEPARATOR.join(c.models) for c in changes],
            "tin": [c.input_tokens for c in changes],
            "tcached": [c.cached_input_tokens for c in changes],
            "tout": [c.output_tokens for c in changes],
            "gross": [c.gross_micros for c in changes],
            "billed": [c.billed_micros for c in changes],
            "credited": [c.credited_micros for c in changes],
            "outcomes": [c.outcome for c in changes],
            "statuses": [c.status for c in changes],
            "explanations": [c.explanation for c in changes],
        },
    )
