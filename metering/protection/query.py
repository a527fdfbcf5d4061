"""Reading a tenant's period for the cost of protection report.

Runs are read in chunks by run id (keyset), and each chunk is folded into the report and
dropped, so memory stays bounded by the chunk and the number of customers. A run counts in
the period of its decision in force (``runs.period``), with that decision's amounts.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

import psycopg

from metering.policy import HELD_FOR_REVIEW, RunFacts
from metering.prices import PROVIDER_COSTS, load_catalog
from metering.pricing import PriceCatalog, TokenCounts, UnknownModelError
from metering.protection.attribution import attribute_lines, crediting_rules
from metering.protection.report import (
    TOP_CUSTOMERS,
    CostedLine,
    ProtectionReport,
    SettledRun,
    build_report,
    decided_lines,
)
from metering.settlement.repo import Evidence, load_evidence

CHUNK = 1_000

DECISIONS_IN_FORCE = """
SELECT r.id, r.customer_id, r.terminal_at IS NULL, d.outcome, d.gross_micros,
       d.billed_micros, d.credited_micros, d.credited_line_ids, d.rule_ids
FROM runs r JOIN decisions d ON d.run_id = r.id AND d.version = r.decision_version
WHERE r.tenant_id = %(tenant)s AND r.period = %(period)s AND r.decision_version > 0
  AND r.id > %(after)s
ORDER BY r.id LIMIT %(limit)s
"""

USAGE = """
SELECT run_id, id, model, input_tokens, cached_input_tokens, output_tokens, gross_micros, time
FROM usage_lines WHERE run_id = ANY(%(ids)s)
"""


@dataclass(frozen=True, slots=True)
class _Decided:
    run_id: int
    customer_id: str
    abandoned: bool
    outcome: str
    gross_micros: int
    billed_micros: int
    credited_micros: int
    credited_line_ids: list[int]
    rule_ids: list[str]


def protection_report(
    conn: psycopg.Connection[Any], tenant_id: str, period: str, *, top: int = TOP_CUSTOMERS
) -> ProtectionReport:
    """The period's report for one tenant (read-only; any transaction will do)."""
    costs = load_catalog(conn, PROVIDER_COSTS)
    return build_report(tenant_id, period, _settled_runs(conn, tenant_id, period, costs), top=top)


def _settled_runs(
    conn: psycopg.Connection[Any], tenant_id: str, period: str, costs: PriceCatalog
) -> Iterator[SettledRun]:
    after = 0
    while True:
        params = {"tenant": tenant_id, "period": period, "after": after, "limit": CHUNK}
        chunk = [_Decided(*row) for row in conn.execute(DECISIONS_IN_FORCE, params).fetchall()]
        if not chunk:
            return
        yield from _costed(conn, chunk, costs)
        after = chunk[-1].run_id


def _costed(
    conn: psycopg.Connection[Any], chunk: Sequence[_Decided], costs: PriceCatalog
) -> Iterator[SettledRun]:
    lines: dict[int, list[CostedLine]] = {}
    for run_id, line_id, model, inp, cached, out, gross, time in conn.execute(
        USAGE, {"ids": [d.run_id for d in chunk]}
    ).fetchall():
        cost = _line_cost(costs, model, TokenCounts(inp, cached, out), time)
        lines.setdefault(run_id, []).append(CostedLine(line_id, gross, cost))
    # Events are read only for the runs whose credited lines more than one rule named.
    ambiguous = [
        d.run_id
        for d in chunk
        if d.outcome != HELD_FOR_REVIEW and len(crediting_rules(d.rule_ids)) > 1
    ]
    evidence = load_evidence(conn, ambiguous) if ambiguous else Evidence({}, {}, {}, {})
    for d in chunk:
        held = d.outcome == HELD_FOR_REVIEW
        facts = partial(_facts, evidence, d)
        yield SettledRun(
            run_id=d.run_id,
            customer_id=d.customer_id,
            held=held,
            gross_micros=d.gross_micros,
            billed_micros=d.billed_micros,
            credited_micros=d.credited_micros,
            lines=decided_lines(lines.get(d.run_id, ()), d.gross_micros),
            credited_by_line={}
            if held
            else attribute_lines(d.credited_line_ids, d.rule_ids, facts),
        )


def _facts(evidence: Evidence, decided: _Decided) -> RunFacts:
    return RunFacts(
        events=tuple(evidence.events.get(decided.run_id, ())),
        usage=tuple(evidence.usage.get(decided.run_id, ())),
        abandoned=decided.abandoned,
    )


def _line_cost(costs: PriceCatalog, model: str, tokens: TokenCounts, at: datetime) -> int | None:
    try:
        return costs.price_usage(model, tokens, at).total_micros
    except UnknownModelError:
        return None
