"""Loading a chunk of runs' facts, and writing decisions and postings — bulk SQL.

Settlement runs in chunks (hundreds of runs per transaction), so each read and write here is
one statement for the whole chunk.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import msgspec
import psycopg

from metering.history.partitions import RUNS_RECEIVED_SINCE
from metering.policy import CustomerPeriod, EventFact, UsageLine
from metering.policy.support import SupportGrant
from metering.settlement.decided_facts import LinePricing
from metering.settlement.due import RunClock


@dataclass(frozen=True, slots=True)
class LockedRun:
    run_id: int
    tenant_id: str
    subject: str
    customer_id: str
    clock: RunClock
    gross_micros: int
    evidence_version: int
    settled_evidence_version: int
    decision_version: int
    billed_micros: int
    credited_micros: int
    period: str | None
    first_event_at: datetime
    support_credit_micros: int = 0  # Σ of the run's support_credits rows, written with them
    support_released: bool = False
    # What the run shows before this settlement, for the notifications it may cause: the
    # decision in force's outcome and words, parking, and the words last announced.
    outcome: str | None = None
    status: str | None = None
    parked: bool = False
    announced_status: str | None = None


LOCK_RUNS = """
SELECT id, tenant_id, subject, customer_id, terminal_at, last_event_at, last_lost_at,
       last_recovered_at, gross_micros, evidence_version, settled_evidence_version,
       decision_version, billed_micros, credited_micros, period, first_event_at,
       support_credit_micros, support_released, outcome, status, parked_at IS NOT NULL,
       announced_status
FROM runs WHERE id = ANY(%(ids)s) ORDER BY id FOR UPDATE
"""


def lock_customers(conn: psycopg.Connection[Any], run_ids: Sequence[int]) -> None:
    """Serialise settlement per customer (R8 reads the customer's earlier decisions).

    Advisory locks are taken before the run rows, in one global order, so two chunks never
    wait on each other in a cycle.
    """
    conn.execute(
        """
        SELECT pg_advisory_xact_lock(hashtextextended(tenant_id || '/' || customer_id, 0))
        FROM (SELECT DISTINCT tenant_id, customer_id FROM runs WHERE id = ANY(%(ids)s)
              ORDER BY 1, 2) AS customers
        """,
        {"ids": list(run_ids)},
    )


def lock_runs(conn: psycopg.Connection[Any], run_ids: Sequence[int]) -> list[LockedRun]:
    rows = conn.execute(LOCK_RUNS, {"ids": list(run_ids)}).fetchall()
    return [
        LockedRun(
            run_id=r[0],
            tenant_id=r[1],
            subject=r[2],
            customer_id=r[3],
            clock=RunClock(
                terminal_at=r[4], last_event_at=r[5], last_lost_at=r[6], last_recovered_at=r[7]
            ),
            gross_micros=r[8],
            evidence_version=r[9],
            settled_evidence_version=r[10],
            decision_version=r[11],
            billed_micros=r[12],
            credited_micros=r[13],
            period=r[14],
            first_event_at=r[15],
            support_credit_micros=r[16],
            support_released=r[17],
            outcome=r[18],
            status=r[19],
            parked=r[20],
            announced_status=r[21],
        )
        for r in rows
    ]


@dataclass(frozen=True, slots=True)
class UsageSummary:
    models: tuple[str, ...] = ()
    input_tokens: int = 0
    cached_input_tokens: int = 0
    output_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Evidence:
    """What settlement reads of a chunk's runs, by run id."""

    events: dict[int, list[EventFact]]
    usage: dict[int, list[UsageLine]]
    summaries: dict[int, UsageSummary]  # models and tokens, kept on the decision
    pricing: dict[int, list[LinePricing]]  # of each line of ``usage``, in its order


# ``data`` as text: decoding all of a chunk's bodies in one msgspec call costs a fraction of
# psycopg's per-value jsonb loader.
# Both read only the months the runs' rows can be in (RUNS_RECEIVED_SINCE).
LOAD_EVENTS = f"""
SELECT run_id, id, source || '/' || event_id, type, time, data::text FROM events
WHERE run_id = ANY(%(ids)s) AND received_at >= {RUNS_RECEIVED_SINCE}
"""

LOAD_USAGE = f"""
SELECT run_id, id, event_pk, step, attempt, tool_call_id, replay, gross_micros, time, model,
       input_tokens, cached_input_tokens, output_tokens
FROM usage_lines WHERE run_id = ANY(%(ids)s) AND received_at >= {RUNS_RECEIVED_SINCE}
"""


def load_evidence(conn: psycopg.Connection[Any], run_ids: Sequence[int]) -> Evidence:
    """The runs' events and usage lines, in two statements (the hot read of settlement).

    Event ids are unique per source only, so the policy sees "source/id"; a usage line
    names its event by that too, looked up among the run's events rather than joined.
    """
    params = {"ids": list(run_ids)}
    event_rows = conn.execute(LOAD_EVENTS, params).fetchall()
    usage_rows = conn.execute(LOAD_USAGE, params).fetchall()
    bodies = msgspec.json.decode("[" + ",".join(row[5] for row in event_rows) + "]")
    events: dict[int, list[EventFact]] = {}
    names: dict[int, str] = {}
    for (run_id, pk, event_id, type_, time, _), data in zip(event_rows, bodies, strict=True):
        events.setdefault(run_id, []).append(EventFact(event_id, type_, time, data))
        names[pk] = event_id
    usage: dict[int, list[UsageLine]] = {}
    pricing: dict[int, list[LinePricing]] = {}
    for run_id, line_id, event_pk, *line, model, inp, cached, out in usage_rows:
        usage.setdefault(run_id, []).append(UsageLine(line_id, names[event_pk], *line))
        pricing.setdefault(run_id, []).append((model, inp, cached, out))
    return Evidence(events, usage, _summaries(usage_rows), pricing)


def _summaries(usage_rows: Sequence[tuple[Any, ...]]) -> dict[int, UsageSummary]:
    models: dict[int, set[str]] = {}
    tokens: dict[int, list[int]] = {}
    for run_id, *_, model, input_tokens, cached_input_tokens, output_tokens in usage_rows:
        models.setdefault(run_id, set()).add(model)
        sums = tokens.setdefault(run_id, [0, 0, 0])
        sums[0] += input_tokens
        sums[1] += cached_input_tokens
        sums[2] += output_tokens
    return {
        run_id: UsageSummary(tuple(sorted(models[run_id])), *sums)
        for run_id, sums in tokens.items()
    }


def load_support_grants(
    conn: psycopg.Connection[Any], runs: Sequence[LockedRun]
) -> dict[int, list[SupportGrant]]:
    """The support credits of the runs that have any; no statement when none has (most)."""
    ids = [r.run_id for r in runs if r.support_credit_micros > 0]
    if not ids:
        return {}
    rows = conn.execute(
        "SELECT run_id, amount_micros, covers_line_id FROM support_credits "
        "WHERE run_id = ANY(%(ids)s) ORDER BY run_id, grant_no",
        {"ids": ids},
    ).fetchall()
    grants: dict[int, list[SupportGrant]] = {}
    for run_id, amount_micros, covers_line_id in rows:
        grants.setdefault(run_id, []).append(SupportGrant(amount_micros, covers_line_id))
    return grants


@dataclass
class PeriodTotals:
    """A customer's decided runs in one period, excluding the runs being settled now."""

    gross_micros: int = 0
    auto_credited_micros: int = 0
    auto_refunded_runs: int = 0


def load_period_totals(
    conn: psycopg.Connection[Any], runs: Sequence[LockedRun], periods: dict[int, str]
) -> dict[tuple[str, str, str], PeriodTotals]:
    keys = sorted({(r.tenant_id, r.customer_id, periods[r.run_id]) for r in runs})
    rows = conn.execute(
        """
        SELECT r.tenant_id, r.customer_id, r.period, sum(r.gross_micros),
               sum(r.auto_credited_micros),
               count(*) FILTER (WHERE r.outcome = 'refunded' AND r.auto_credited_micros > 0)
        FROM runs r
        JOIN unnest(%(tenants)s::text[], %(customers)s::text[], %(periods)s::text[])
             AS k(tenant_id, customer_id, period)
          ON r.tenant_id = k.tenant_id AND r.customer_id = k.customer_id
         AND r.period = k.period
        WHERE r.id <> ALL(%(exclude)s) AND r.decision_version > 0
        GROUP BY r.tenant_id, r.customer_id, r.period
        """,
        {
            "tenants": [k[0] for k in keys],
            "customers": [k[1] for k in keys],
            "periods": [k[2] for k in keys],
            "exclude": [r.run_id for r in runs],
        },
    ).fetchall()
    totals = {key: PeriodTotals() for key in keys}
    for tenant, customer, period, gross, credited, refunded in rows:
        totals[(tenant, customer, period)] = PeriodTotals(int(gross), int(credited), int(refunded))
    return totals


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    """A new decision version to store, with the run's new ledger position."""

    run_id: int
    version: int
    tenant_id: str
    customer_id: str
    origin: str
    outcome: str
    status: str
    gross_micros: int
    billed_micros: int
    credited_micros: int
    credited_line_ids: tuple[int, ...]
    rule_ids: tuple[str, ...]
    evidence_event_ids: tuple[str, ...]
    explanation: str
    evidence_version: int
    period: str
    statement_period: str
    started_at: datetime
    usage: UsageSummary
    ended_at: datetime
    position_billed_micros: int
    position_credited_micros: int
    auto_credited_micros: int
    policy_version: int = 0  # the tenant's policy version that made it (0: the settings)
    # The R8 inputs decide() was given, kept so a replay gives the same.
    period_inputs: CustomerPeriod = field(default_factory=CustomerPeriod)


DECISION_COLUMNS = (
    "run_id, version, tenant_id, customer_id, origin, outcome, status, gross_micros, "
    "billed_micros, credited_micros, credited_line_ids, rule_ids, evidence_event_ids, "
    "explanation, evidence_version, period, ended_at, statement_period, started_at, models, "
    "input_tokens, cached_input_tokens, output_tokens, policy_version, period_gross_micros, "
    "period_auto_credited_micros, period_auto_refunded_runs, facts"
)


def _int_array(items: Sequence[int]) -> str:
    return "{" + ",".join(map(str, items)) + "}"


def _text_array(items: Sequence[str]) -> str:
    """A PostgreSQL array literal: every element quoted, its quotes and backslashes escaped
    (then ``COPY`` escapes the literal as any other text)."""
    quoted = (item.replace("\\", "\\\\").replace('"', '\\"') for item in items)
    return "{" + ",".join(f'"{item}"' for item in quoted) + "}"


def insert_decisions(
    conn: psycopg.Connection[Any],
    records: Sequence[DecisionRecord],
    facts: Mapping[int, bytes | None] | None = None,
) -> None:
    """COPY, not INSERT: one stream for the chunk instead of a statement per decision.
    ``facts``: the record of the facts each run was decided on, by run id (none: NULL).

    Array columns go as literals made here: psycopg dumps a list element by element in
    Python, which was most of this function's time.
    """
    if not records:
        return
    with conn.cursor() as cur, cur.copy(f"COPY decisions ({DECISION_COLUMNS}) FROM STDIN") as copy:
        for d in records:
            copy.write_row(
                (
                    d.run_id,
                    d.version,
                    d.tenant_id,
                    d.customer_id,
                    d.origin,
                    d.outcome,
                    d.status,
                    d.gross_micros,
                    d.billed_micros,
                    d.credited_micros,
                    _int_array(d.credited_line_ids),
                    _text_array(d.rule_ids),
                    _text_array(d.evidence_event_ids),
                    d.explanation,
                    d.evidence_version,
                    d.period,
                    d.ended_at,
                    d.statement_period,
                    d.started_at,
                    _text_array(d.usage.models),
                    d.usage.input_tokens,
                    d.usage.cached_input_tokens,
                    d.usage.output_tokens,
                    d.policy_version,
                    d.period_inputs.period_gross_micros,
                    d.period_inputs.auto_credited_micros,
                    d.period_inputs.auto_refunded_runs,
                    (facts or {}).get(d.run_id),
                )
            )


def as_json(records: Sequence[Any]) -> str:
    """Dataclass records as one JSON array of objects, for ``json_to_recordset``.

    One text parameter per statement instead of an array per column: psycopg builds array
    parameters element by element in Python, msgspec encodes the whole chunk in C.
    """
    return msgspec.json.encode(records).decode()


def mark_settled(
    conn: psycopg.Connection[Any],
    decided: Sequence[DecisionRecord],
    unchanged: Sequence[LockedRun],
) -> None:
    """Record the decision in force on each run and release the sweeper's claim."""
    if decided:
        conn.execute(
            """
            UPDATE runs SET decision_version = d.version, outcome = d.outcome, status = d.status,
                   period = d.period, ended_at = d.ended_at,
                   billed_micros = d.position_billed_micros,
                   credited_micros = d.position_credited_micros,
                   auto_credited_micros = d.auto_credited_micros,
                   settled_evidence_version = d.evidence_version, claimed_until = NULL,
                   settle_attempts = 0
            FROM json_to_recordset(%(decided)s::json)
                 AS d(run_id bigint, version int, outcome text, status text, period text,
                      ended_at timestamptz, position_billed_micros bigint,
                      position_credited_micros bigint, auto_credited_micros bigint,
                      evidence_version int)
            WHERE runs.id = d.run_id
            """,
            {"decided": as_json(decided)},
        )
    if unchanged:
        conn.execute(
            """
            UPDATE runs SET settled_evidence_version = u.evidence_version, claimed_until = NULL,
                   settle_attempts = 0
            FROM unnest(%(ids)s::bigint[], %(evidence)s::int[]) AS u(id, evidence_version)
            WHERE runs.id = u.id
            """,
            {
                "ids": [r.run_id for r in unchanged],
                "evidence": [r.evidence_version for r in unchanged],
            },
        )


def latest_decisions(
    conn: psycopg.Connection[Any], runs: Sequence[LockedRun]
) -> dict[int, tuple[str, int, int, tuple[int, ...], tuple[str, ...]]]:
    """The decision in force of each already-decided run, as a comparable tuple."""
    decided = [(r.run_id, r.decision_version) for r in runs if r.decision_version > 0]
    if not decided:
        return {}
    rows = conn.execute(
        """
        SELECT d.run_id, d.outcome, d.billed_micros, d.credited_micros, d.credited_line_ids,
               d.rule_ids
        FROM decisions d
        JOIN unnest(%(ids)s::bigint[], %(versions)s::int[]) AS k(run_id, version)
          ON d.run_id = k.run_id AND d.version = k.version
        """,
        {"ids": [d[0] for d in decided], "versions": [d[1] for d in decided]},
    ).fetchall()
    return {r[0]: (r[1], r[2], r[3], tuple(r[4]), tuple(r[5])) for r in rows}


def release_claims(conn: psycopg.Connection[Any], run_ids: Sequence[int]) -> None:
    """Claimed runs that turned out not to be due (new events came in) go back to the pool."""
    if run_ids:
        conn.execute(
            "UPDATE runs SET claimed_until = NULL, settle_attempts = 0 WHERE id = ANY(%(ids)s)",
            {"ids": list(run_ids)},
        )
