"""Bulk data straight in SQL: many settled runs for one customer, in seconds.

For the tests and the benches that need a big statement, not for production: the rows are
written as settlement would leave them, without going through ingest and the policy.
"""

from __future__ import annotations

from typing import Any

from metering.statements import totals

EXPLANATION = (
    "The run completed at 10:42 after the agent edited 14 files and ran the test suite twice; "
    "all of its usage was billed at the catalog prices in force when each model call was made."
)


def settled_runs(db: Any, *, tenant: str, customer: str, count: int, period: str) -> None:
    """``count`` confirmed runs with one decision each, ending through ``period``."""
    db.execute("INSERT INTO tenants (id) VALUES (%s) ON CONFLICT DO NOTHING", (tenant,))
    db.execute(
        "INSERT INTO customers (tenant_id, id) VALUES (%s, %s) ON CONFLICT DO NOTHING",
        (tenant, customer),
    )
    params = {
        "tenant": tenant,
        "customer": customer,
        "count": count,
        "period": period,
        "start": f"{period}-01T00:00:00Z",
        "explanation": EXPLANATION,
    }
    db.execute(
        """
        INSERT INTO runs (tenant_id, subject, customer_id, first_event_at, last_event_at,
            last_received_at, terminal_at, event_count, gross_micros, evidence_version,
            settled_evidence_version, decision_version, outcome, status, period, ended_at,
            billed_micros, credited_micros)
        SELECT %(tenant)s, 'bulk-run-' || g, %(customer)s, t - interval '5 minutes', t, t, t, 20,
               1000 + g, 20, 20, 1, 'confirmed', 'Completed', %(period)s, t, 1000 + g, 0
        FROM generate_series(1, %(count)s) AS g,
             LATERAL (SELECT %(start)s::timestamptz + g * interval '20 seconds' AS t) AS x
        """,
        params,
    )
    db.execute(
        """
        INSERT INTO decisions (run_id, version, tenant_id, customer_id, origin, outcome, status,
            gross_micros, billed_micros, credited_micros, credited_line_ids, rule_ids,
            evidence_event_ids, explanation, evidence_version, period, ended_at,
            statement_period, started_at, models, input_tokens, cached_input_tokens,
            output_tokens)
        SELECT r.id, 1, r.tenant_id, r.customer_id, 'policy', 'confirmed', 'Completed',
               r.gross_micros, r.gross_micros, 0, '{}', '{R0}', '{}', %(explanation)s, 20,
               %(period)s, r.ended_at, %(period)s, r.first_event_at,
               '{agent-large-1,agent-small-1}', 120000, 40000, 9000
        FROM runs r WHERE r.tenant_id = %(tenant)s AND r.customer_id = %(customer)s
        """,
        params,
    )
    db.execute(
        """
        INSERT INTO statement_lines (run_id, statement_period, tenant_id, customer_id, subject,
            kind, run_period, version, started_at, ended_at, decided_at, models, input_tokens,
            cached_input_tokens, output_tokens, gross_abs, billed_abs, credited_abs,
            base_gross, base_billed, base_credited, outcome, status, explanation)
        SELECT d.run_id, d.statement_period, d.tenant_id, d.customer_id, r.subject, 'run',
               d.period, d.version, d.started_at, d.ended_at, d.decided_at, d.models,
               d.input_tokens, d.cached_input_tokens, d.output_tokens, d.gross_micros,
               d.billed_micros, d.credited_micros, 0, 0, 0, d.outcome, d.status, d.explanation
        FROM decisions d JOIN runs r ON r.id = d.run_id
        WHERE d.tenant_id = %(tenant)s AND d.customer_id = %(customer)s
        """,
        params,
    )
    # The statement's sums, as settlement keeps them beside its lines.
    totals.rebuild(db, tenant)
