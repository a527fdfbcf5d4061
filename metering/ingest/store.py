"""Storing validated events: runs, raw events, usage lines and their ledger holds.

This is the ingest hot path, so it speaks SQL to psycopg directly, one multi-row
statement per table whatever the batch size (``unnest`` of arrays), instead of going
through the ORM's unit of work (see docs/benchmarks.md). The caller owns the transaction.

Concurrency: runs are upserted in subject order, which takes their row locks in one global
order, so two requests touching the same runs serialise instead of deadlocking.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from metering.errors import FieldError, conflict, validation_error
from metering.ingest.catalogue import TERMINAL_TYPES, USAGE_TYPE
from metering.ingest.validation import ValidEvent
from metering.pricing import PricedUsage

EventKey = tuple[str, str]  # (source, id)
# Signs of life after a drop: they close an open connection.lost for the resume window.
RECOVERY_TYPES = frozenset({"connection.restored", "run.resumed", USAGE_TYPE})


@dataclass(frozen=True, slots=True)
class EventOutcome:
    source: str
    id: str
    result: str  # "accepted" | "duplicate"


@dataclass(frozen=True, slots=True)
class IngestResult:
    accepted: int
    duplicates: int
    events: list[EventOutcome]


UPSERT_CUSTOMERS = """
INSERT INTO customers (tenant_id, id)
SELECT %(tenant)s, c FROM unnest(%(customers)s::text[]) AS c
ON CONFLICT DO NOTHING
"""

# DO UPDATE (not DO NOTHING) so the row comes back locked and with its stored customer.
UPSERT_RUNS = """
INSERT INTO runs (tenant_id, subject, customer_id, first_event_at, last_event_at,
                  last_received_at, event_count)
SELECT %(tenant)s, s, c, t, t, %(now)s, 0
FROM unnest(%(subjects)s::text[], %(customers)s::text[], %(times)s::timestamptz[]) AS u(s, c, t)
ORDER BY s
ON CONFLICT (tenant_id, subject) DO UPDATE SET last_received_at = EXCLUDED.last_received_at
RETURNING id, subject, customer_id
"""

INSERT_EVENTS = """
INSERT INTO events (tenant_id, source, event_id, type, run_id, time, received_at, body_hash,
                    attributes, data)
SELECT %(tenant)s, src, eid, typ, rid, t, %(now)s, h, a, d
FROM unnest(%(sources)s::text[], %(ids)s::text[], %(types)s::text[], %(run_ids)s::bigint[],
            %(times)s::timestamptz[], %(hashes)s::bytea[], %(attrs)s::jsonb[],
            %(datas)s::jsonb[]) AS u(src, eid, typ, rid, t, h, a, d)
ORDER BY src, eid
ON CONFLICT (tenant_id, source, event_id) DO NOTHING
RETURNING id, source, event_id
"""

EXISTING_HASHES = """
SELECT source, event_id, body_hash FROM events
WHERE tenant_id = %(tenant)s
  AND (source, event_id) IN (SELECT * FROM unnest(%(sources)s::text[], %(ids)s::text[]))
"""

INSERT_USAGE_AND_HOLDS = """
WITH lines AS (
    INSERT INTO usage_lines (event_pk, run_id, model, step, attempt, tool_call_id, replay,
                             input_tokens, cached_input_tokens, output_tokens,
                             input_micros, cached_input_micros, output_micros, gross_micros, time)
    SELECT * FROM unnest(%(event_pks)s::bigint[], %(run_ids)s::bigint[], %(models)s::text[],
                         %(steps)s::int[], %(attempts)s::int[], %(tool_calls)s::text[],
                         %(replays)s::bool[], %(in_tok)s::bigint[], %(cached_tok)s::bigint[],
                         %(out_tok)s::bigint[], %(in_mic)s::bigint[], %(cached_mic)s::bigint[],
                         %(out_mic)s::bigint[], %(gross)s::bigint[], %(times)s::timestamptz[])
    RETURNING id, run_id, gross_micros
)
INSERT INTO ledger_entries (tenant_id, customer_id, run_id, kind, amount_micros, usage_line_id)
SELECT %(tenant)s, r.customer_id, lines.run_id, 'hold', lines.gross_micros, lines.id
FROM lines JOIN runs r ON r.id = lines.run_id
"""

UPDATE_RUN_AGGREGATES = """
UPDATE runs SET
    event_count = runs.event_count + agg.n,
    evidence_version = runs.evidence_version + agg.n,
    gross_micros = runs.gross_micros + agg.gross,
    first_event_at = LEAST(runs.first_event_at, agg.first_at),
    last_event_at = GREATEST(runs.last_event_at, agg.last_at),
    terminal_at = LEAST(runs.terminal_at, agg.terminal_at),
    last_lost_at = GREATEST(runs.last_lost_at, agg.lost_at),
    last_recovered_at = GREATEST(runs.last_recovered_at, agg.recovered_at)
FROM (
    SELECT rid, count(*) AS n, sum(g) AS gross, min(t) AS first_at, max(t) AS last_at,
           min(t) FILTER (WHERE kind = 'terminal') AS terminal_at,
           max(t) FILTER (WHERE kind = 'lost') AS lost_at,
           max(t) FILTER (WHERE kind = 'recovered') AS recovered_at
    FROM unnest(%(run_ids)s::bigint[], %(times)s::timestamptz[], %(kinds)s::text[],
                %(gross)s::bigint[]) AS u(rid, t, kind, g)
    GROUP BY rid
) AS agg
WHERE runs.id = agg.rid
"""


def store_events(
    conn: psycopg.Connection[Any],
    tenant_id: str,
    events: Sequence[ValidEvent],
    prices: dict[int, PricedUsage],
    now: datetime,
    *,
    known_customers: set[str] | None = None,
    single: bool = False,
) -> IngestResult:
    """Store ``events`` (validated, usage already priced by event index) idempotently.

    Raises 422 ``customer_mismatch`` when a run is already owned by another customer and
    409 ``event_conflict`` when an id was used before for other content; the caller's
    transaction then rolls back, so nothing of the request is kept.
    """
    unique, in_request_duplicates = _dedupe_within_request(events, single=single)
    with conn.cursor() as cur:
        new_customers = sorted({e.customer for e in unique} - (known_customers or set()))
        if new_customers:
            cur.execute(UPSERT_CUSTOMERS, {"tenant": tenant_id, "customers": new_customers})
        run_ids = _upsert_runs(cur, tenant_id, unique, now, single=single)
        inserted = _insert_events(cur, tenant_id, unique, run_ids, now)
        _reject_conflicts(cur, tenant_id, unique, inserted)
        fresh = [e for e in unique if (e.source, e.id) in inserted]
        _insert_usage(cur, tenant_id, fresh, run_ids, inserted, prices)
        _update_run_aggregates(cur, fresh, run_ids, prices)
    outcomes = []
    for event in events:
        is_new = (event.source, event.id) in inserted and event.index not in in_request_duplicates
        outcomes.append(EventOutcome(event.source, event.id, "accepted" if is_new else "duplicate"))
    accepted = sum(1 for o in outcomes if o.result == "accepted")
    return IngestResult(accepted=accepted, duplicates=len(outcomes) - accepted, events=outcomes)


def _dedupe_within_request(
    events: Sequence[ValidEvent], *, single: bool
) -> tuple[list[ValidEvent], set[int]]:
    first: dict[EventKey, ValidEvent] = {}
    repeats: set[int] = set()
    clashes: list[str] = []
    for event in events:
        key = (event.source, event.id)
        seen = first.setdefault(key, event)
        if seen is not event:
            if seen.body_hash != event.body_hash:
                clashes.append(f"{event.source}/{event.id}")
            repeats.add(event.index)
    if clashes:
        raise conflict(
            "the same event id was sent twice in this request with different content",
            code="event_conflict",
            conflicting_ids=clashes,
        )
    return list(first.values()), repeats


def _upsert_runs(
    cur: psycopg.Cursor[Any],
    tenant_id: str,
    events: Sequence[ValidEvent],
    now: datetime,
    *,
    single: bool,
) -> dict[str, int]:
    first_of_run: dict[str, ValidEvent] = {}
    for event in events:
        first_of_run.setdefault(event.subject, event)
    subjects = sorted(first_of_run)
    cur.execute(
        UPSERT_RUNS,
        {
            "tenant": tenant_id,
            "now": now,
            "subjects": subjects,
            "customers": [first_of_run[s].customer for s in subjects],
            "times": [first_of_run[s].time for s in subjects],
        },
    )
    run_ids: dict[str, int] = {}
    errors = []
    for run_id, subject, owner in cur.fetchall():
        run_ids[subject] = run_id
        event = first_of_run[subject]
        if owner != event.customer:
            path = "$.data.customer" if single else f"$[{event.index}].data.customer"
            errors.append(
                FieldError(path, "customer_mismatch", f"run {subject} belongs to another customer")
            )
    if errors:
        raise validation_error(errors)
    return run_ids


def _insert_events(
    cur: psycopg.Cursor[Any],
    tenant_id: str,
    events: Sequence[ValidEvent],
    run_ids: dict[str, int],
    now: datetime,
) -> dict[EventKey, int]:
    cur.execute(
        INSERT_EVENTS,
        {
            "tenant": tenant_id,
            "now": now,
            "sources": [e.source for e in events],
            "ids": [e.id for e in events],
            "types": [e.type for e in events],
            "run_ids": [run_ids[e.subject] for e in events],
            "times": [e.time for e in events],
            "hashes": [e.body_hash for e in events],
            "attrs": [Jsonb(e.attributes) for e in events],
            "datas": [Jsonb(e.data) for e in events],
        },
    )
    return {(source, event_id): pk for pk, source, event_id in cur.fetchall()}


def _reject_conflicts(
    cur: psycopg.Cursor[Any],
    tenant_id: str,
    events: Sequence[ValidEvent],
    inserted: dict[EventKey, int],
) -> None:
    """An id already stored with other content is a 409 for the whole request."""
    repeated = [e for e in events if (e.source, e.id) not in inserted]
    if not repeated:
        return
    cur.execute(
        EXISTING_HASHES,
        {
            "tenant": tenant_id,
            "sources": [e.source for e in repeated],
            "ids": [e.id for e in repeated],
        },
    )
    stored = {(source, event_id): bytes(h) for source, event_id, h in cur.fetchall()}
    clashes = [
        f"{e.source}/{e.id}" for e in repeated if stored.get((e.source, e.id)) != e.body_hash
    ]
    if clashes:
        raise conflict(
            "an event with this id was already accepted with different content",
            code="event_conflict",
            conflicting_ids=clashes,
        )


def _insert_usage(
    cur: psycopg.Cursor[Any],
    tenant_id: str,
    fresh: Sequence[ValidEvent],
    run_ids: dict[str, int],
    inserted: dict[EventKey, int],
    prices: dict[int, PricedUsage],
) -> None:
    usage = [e for e in fresh if e.type == USAGE_TYPE]
    if not usage:
        return
    priced = [prices[e.index] for e in usage]
    cur.execute(
        INSERT_USAGE_AND_HOLDS,
        {
            "tenant": tenant_id,
            "event_pks": [inserted[(e.source, e.id)] for e in usage],
            "run_ids": [run_ids[e.subject] for e in usage],
            "models": [e.data["model"] for e in usage],
            "steps": [e.data["step"] for e in usage],
            "attempts": [e.data.get("attempt", 1) for e in usage],
            "tool_calls": [e.data.get("tool_call_id") for e in usage],
            "replays": [bool(e.data.get("replay", False)) for e in usage],
            "in_tok": [e.data["input_tokens"] for e in usage],
            "cached_tok": [e.data.get("cached_input_tokens", 0) for e in usage],
            "out_tok": [e.data["output_tokens"] for e in usage],
            "in_mic": [p.input_micros for p in priced],
            "cached_mic": [p.cached_input_micros for p in priced],
            "out_mic": [p.output_micros for p in priced],
            "gross": [p.total_micros for p in priced],
            "times": [e.time for e in usage],
        },
    )


def clock_kind(event: ValidEvent) -> str:
    """How an event moves the run's settlement clock (see ``metering.settlement.due``)."""
    if event.type in TERMINAL_TYPES:
        return "terminal"
    if event.type == "connection.lost":
        return "lost"
    if event.type in RECOVERY_TYPES:
        return "recovered"
    return "other"


def _update_run_aggregates(
    cur: psycopg.Cursor[Any],
    fresh: Sequence[ValidEvent],
    run_ids: dict[str, int],
    prices: dict[int, PricedUsage],
) -> None:
    if not fresh:
        return
    cur.execute(
        UPDATE_RUN_AGGREGATES,
        {
            "run_ids": [run_ids[e.subject] for e in fresh],
            "times": [e.time for e in fresh],
            "kinds": [clock_kind(e) for e in fresh],
            "gross": [prices[e.index].total_micros if e.index in prices else 0 for e in fresh],
        },
    )
