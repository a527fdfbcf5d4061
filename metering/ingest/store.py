"""Storing validated events: runs, raw events, usage lines and their ledger holds.

This is the ingest hot path, so it speaks SQL to psycopg directly instead of going through
the ORM's unit of work, and stores a request of any size in two round trips (measured in
docs/benchmarks.md): customers and runs, pipelined; then one statement for everything keyed
by event. Each statement takes its rows as one JSON parameter expanded by
``json_to_recordset``, far cheaper to build than one array per column. The caller owns the
transaction.

Concurrency: customers, then runs, then events are written each in key order, and all runs
(one statement) before any event (the next), which takes their locks in one global order:
two requests touching the same runs serialise instead of deadlocking.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import msgspec
import psycopg

from metering.catalogue import TERMINAL_TYPES, USAGE_TYPE
from metering.errors import FieldError, conflict, validation_error
from metering.ingest.announce import RunState, announce_changes, new_run_status
from metering.ingest.outcomes import EventKey, dedupe_within_request, outcome, result_of
from metering.ingest.outcomes import EventOutcome as EventOutcome  # importers of store
from metering.ingest.outcomes import IngestResult as IngestResult
from metering.ingest.protocol import first_usage_protocol, screen_usage
from metering.ingest.validation import ValidEvent
from metering.ledger.repo import HOLDS_FROM_USAGE_LINES
from metering.notifications.builders import RunRef
from metering.pricing import PricedUsage

# Errors of one request's own values that validation let through (a NUL PostgreSQL's text
# cannot hold, a number out of its range): the request's fault, a 400, never a 500.
UNSTORABLE_VALUES = (psycopg.DataError, UnicodeEncodeError)
# Transaction rollbacks (deadlock, serialization failure) are no one's fault: a request
# stored alone is tried this many times.
STORE_ATTEMPTS = 2
# Signs of life after a drop: they close an open connection.lost for the resume window.
RECOVERY_TYPES = frozenset({"connection.restored", "run.resumed", USAGE_TYPE})


UPSERT_CUSTOMERS = """
INSERT INTO customers (tenant_id, id)
SELECT %(tenant)s, c FROM json_array_elements_text(%(customers)s::json) AS c
ORDER BY c
ON CONFLICT DO NOTHING
"""

# first_received_at is kept at the least received_at of the run's events and usage lines
# (this request's come next, with %(now)s): reads by run skip the months before it
# (metering/history/partitions.py, RUNS_RECEIVED_SINCE), whatever order the clocks gave.
# DO UPDATE (not DO NOTHING) so the row comes back locked and with its stored customer, and
# with what ``announce`` needs of its state before this request's events. A run created
# here gets its status words with it (all its events are in this request); evidence_version
# is still 0 then (the events are counted by the next statement), never after.
# usage_protocol is set by the first request that brings the run usage and kept after: the
# row lock makes two first usages through two protocols take turns, the second seeing the
# first's (``metering.ingest.protocol``).
UPSERT_RUNS = """
INSERT INTO runs (tenant_id, subject, customer_id, first_event_at, last_event_at,
                  first_received_at, last_received_at, event_count, announced_status,
                  usage_protocol)
SELECT %(tenant)s, r.subject, r.customer, r.at, r.at, %(now)s, %(now)s, 0, r.status, r.protocol
FROM json_to_recordset(%(runs)s::json)
     AS r(subject text, customer text, at timestamptz, status text, protocol text)
ORDER BY r.subject
ON CONFLICT (tenant_id, subject) DO UPDATE SET last_received_at = EXCLUDED.last_received_at,
    first_received_at = LEAST(runs.first_received_at, EXCLUDED.first_received_at),
    usage_protocol = coalesce(runs.usage_protocol, EXCLUDED.usage_protocol)
RETURNING id, subject, customer_id, announced_status, evidence_version > 0,
          decision_version > 0, parked_at IS NOT NULL, terminal_at IS NOT NULL, usage_protocol
"""

# One statement for everything keyed by event: the events' keys (in key order: the only
# unique key written here, so its locks are taken in one global order), the events whose
# key is new, the usage lines and holds of those, and the aggregates their runs gain from
# them. The keys live in ``event_keys``, not on the partitioned ``events`` (migration 0024):
# an event is a duplicate forever, also once its month is archived. An event's id is drawn
# with its key, so the event and its usage line point at each other without a lookup.
# The statement's snapshot predates its own inserts, so the last SELECT finds only keys
# stored before: the duplicates, with the hash to tell a repeat from a conflict.
INSERT_EVENTS = f"""
WITH input AS (
    SELECT * FROM json_to_recordset(%(events)s::json) AS x(
        source text, event_id text, type text, run_id bigint, at timestamptz, hash text,
        attributes jsonb, data jsonb, clock text, model text, step int, attempt int,
        tool_call_id text, replay bool, input_tokens bigint, cached_input_tokens bigint,
        output_tokens bigint, input_micros bigint, cached_input_micros bigint,
        output_micros bigint, gross_micros bigint)
),
keys AS (
    INSERT INTO event_keys (tenant_id, source, event_id, body_hash, event_pk, received_at)
    SELECT %(tenant)s::text, i.source, i.event_id, decode(i.hash, 'hex'),
           nextval('events_id_seq'), %(now)s::timestamptz
    FROM input i
    ORDER BY i.source, i.event_id
    ON CONFLICT (tenant_id, source, event_id) DO NOTHING
    RETURNING event_pk, source, event_id, body_hash
),
inserted AS (
    INSERT INTO events (id, tenant_id, source, event_id, type, run_id, time, received_at,
                        body_hash, attributes, data)
    SELECT k.event_pk, %(tenant)s::text, i.source, i.event_id, i.type, i.run_id, i.at,
           %(now)s::timestamptz, k.body_hash, i.attributes, i.data
    FROM keys k JOIN input i ON i.source = k.source AND i.event_id = k.event_id
    RETURNING id, source, event_id
),
fresh AS (
    SELECT e.id AS event_pk, i.*
    FROM inserted e JOIN input i ON i.source = e.source AND i.event_id = e.event_id
),
lines AS (
    INSERT INTO usage_lines (tenant_id, event_pk, run_id, model, step, attempt, tool_call_id,
                             replay, input_tokens, cached_input_tokens, output_tokens,
                             input_micros, cached_input_micros, output_micros, gross_micros, time,
                             received_at)
    SELECT %(tenant)s::text, event_pk, run_id, model, step, attempt, tool_call_id, replay,
           input_tokens, cached_input_tokens, output_tokens,
           input_micros, cached_input_micros, output_micros, gross_micros, at,
           %(now)s::timestamptz
    FROM fresh WHERE type = '{USAGE_TYPE}'
    RETURNING id, run_id, gross_micros
),
holds AS ({HOLDS_FROM_USAGE_LINES}),
aggregates AS (
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
        SELECT run_id, count(*) AS n, coalesce(sum(gross_micros), 0) AS gross,
               min(at) AS first_at, max(at) AS last_at,
               min(at) FILTER (WHERE clock = 'terminal') AS terminal_at,
               max(at) FILTER (WHERE clock = 'lost') AS lost_at,
               max(at) FILTER (WHERE clock = 'recovered') AS recovered_at
        FROM fresh GROUP BY run_id
    ) AS agg
    WHERE runs.id = agg.run_id
)
SELECT source, event_id, id, NULL::bytea FROM inserted
UNION ALL
SELECT i.source, i.event_id, NULL, e.body_hash
FROM input i CROSS JOIN LATERAL (  -- LIMIT keeps it a probe per event, not a join
    SELECT body_hash FROM event_keys
    WHERE tenant_id = %(tenant)s::text AND source = i.source AND event_id = i.event_id
    LIMIT 1
) AS e
"""

# The statements below are prepared, and PostgreSQL plans a prepared statement afresh for
# its first five executions on a connection, and again for five after every ANALYZE of a
# table it reads (autovacuum runs one whenever a table has grown by a tenth). Planning
# INSERT_EVENTS costs more than running it (a 1,000-event batch: ~45 ms against ~38 ms of
# PostgreSQL CPU), and its plan cannot depend on the parameters (the rows arrive as one
# JSON document): the generic plan is the custom plan, without the planning.
# Every read of these statements is a probe of a key, so sequential scans are off for the
# transaction: a generic plan made while a table's statistics say it is empty (an
# ANALYZE of a new database) scans it instead, and that plan is kept for the connection
# until the next ANALYZE. For event_keys' duplicate probe that made a batch's cost grow
# with every event stored: 22 s for one batch after 60,000 events (bench/ingest.py).
GENERIC_PLANS = (
    "SELECT set_config('plan_cache_mode', 'force_generic_plan', true), "
    "set_config('enable_seqscan', 'off', true)"
)

EXISTING_HASHES = """
SELECT source, event_id, body_hash FROM event_keys
WHERE tenant_id = %(tenant)s
  AND (source, event_id) IN (SELECT * FROM unnest(%(sources)s::text[], %(ids)s::text[]))
"""


def _encode_other(value: Any) -> Any:
    if isinstance(value, datetime):  # a subclass, such as freezegun's, in tests
        return value.isoformat()
    raise NotImplementedError(f"cannot encode {type(value).__name__}")


_json = msgspec.json.Encoder(enc_hook=_encode_other)


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
    transaction then rolls back, so nothing of the request is kept. Usage through another
    protocol than its run's (``metering.ingest.protocol``) is a 422
    ``usage_protocol_conflict`` for a CloudEvent, and a "refused" outcome for a span.
    """
    unique, in_request_duplicates = dedupe_within_request(events, single=single)
    new_customers = sorted({e.customer for e in unique} - (known_customers or set()))
    base = {"tenant": tenant_id, "now": now}
    with conn.cursor() as cur:
        with conn.pipeline():  # one round trip for psycopg's BEGIN, customers and runs
            conn.execute(GENERIC_PLANS)
            if new_customers:
                customers = _encode(new_customers)
                conn.execute(UPSERT_CUSTOMERS, {**base, "customers": customers}, prepare=True)
            runs = _encode(_run_rows(unique))
            cur.execute(UPSERT_RUNS, {**base, "runs": runs}, prepare=True)
        run_rows = cur.fetchall()
        states = _run_states(run_rows, tenant_id)
        run_ids = _check_owners(states, unique, single=single)
        screened = screen_usage(unique, {r[1]: r[8] for r in run_rows}, single=single)
        unique = screened.events
        # Run ids go with the events rather than being looked up by subject in SQL: with
        # stale statistics (a new tenant) the planner may pick a (tenant, …) index and scan
        # all the tenant's runs for each event. Prepared at first use: planning this
        # statement costs more than running it.
        rows = _encode(_event_rows(unique, run_ids, prices))
        cur.execute(INSERT_EVENTS, {**base, "events": rows}, prepare=True)
        inserted, stored = _split_outcomes(cur.fetchall())
        _reject_conflicts(conn, tenant_id, unique, inserted, stored)
    fresh: dict[int, list[ValidEvent]] = {}
    for event in unique:
        if (event.source, event.id) in inserted:
            fresh.setdefault(run_ids[event.subject], []).append(event)
    announce_changes(conn, states, fresh, now)
    outcomes = [outcome(e, inserted, in_request_duplicates, screened.refused) for e in events]
    return result_of(outcomes)


def _encode(value: Any) -> str:
    return _json.encode(value).decode()


def _run_rows(events: Sequence[ValidEvent]) -> list[dict[str, Any]]:
    """One row per run, from its first event in the request (subject order is the SQL's),
    with the status words it has if this request creates it."""
    by_run: dict[str, list[ValidEvent]] = {}
    for event in events:
        by_run.setdefault(event.subject, []).append(event)
    return [
        {
            "subject": s,
            "customer": e[0].customer,
            "at": e[0].time,
            "status": new_run_status(e),
            "protocol": first_usage_protocol(e),
        }
        for s, e in by_run.items()
    ]


def _run_states(rows: Sequence[tuple[Any, ...]], tenant_id: str) -> list[RunState]:
    return [
        RunState(
            ref=RunRef(tenant_id, customer, run_id, subject),
            announced=announced,
            had_events=had_events,
            decided=decided,
            parked=parked,
            terminal=terminal,
        )
        for run_id, subject, customer, announced, had_events, decided, parked, terminal, _ in rows
    ]


def _event_rows(
    events: Sequence[ValidEvent], run_ids: dict[str, int], prices: dict[int, PricedUsage]
) -> list[dict[str, Any]]:
    rows = []
    for e in events:
        row: dict[str, Any] = {
            "source": e.source,
            "event_id": e.id,
            "type": e.type,
            "run_id": run_ids[e.subject],
            "at": e.time,
            "hash": e.body_hash.hex(),
            "attributes": e.attributes,
            "data": e.data,
            "clock": clock_kind(e),
        }
        if e.type == USAGE_TYPE:
            row.update(_usage_columns(e.data, prices[e.index]))
        rows.append(row)
    return rows


def _usage_columns(data: dict[str, Any], price: PricedUsage) -> dict[str, Any]:
    return {
        "model": data["model"],
        "step": data["step"],
        "attempt": data.get("attempt", 1),
        "tool_call_id": data.get("tool_call_id"),
        "replay": bool(data.get("replay", False)),
        "input_tokens": data["input_tokens"],
        "cached_input_tokens": data.get("cached_input_tokens", 0),
        "output_tokens": data["output_tokens"],
        "input_micros": price.input_micros,
        "cached_input_micros": price.cached_input_micros,
        "output_micros": price.output_micros,
        "gross_micros": price.total_micros,
    }


def _check_owners(
    runs: Sequence[RunState], events: Sequence[ValidEvent], *, single: bool
) -> dict[str, int]:
    """Run ids by subject; a run already owned by another customer is a 422 for the request."""
    first: dict[str, ValidEvent] = {}
    for event in events:
        first.setdefault(event.subject, event)
    run_ids: dict[str, int] = {}
    errors = []
    for run_id, subject, owner in ((r.ref.run_id, r.ref.subject, r.ref.customer_id) for r in runs):
        run_ids[subject] = run_id
        event = first[subject]
        if owner != event.customer:
            path = "$.data.customer" if single else f"$[{event.index}].data.customer"
            errors.append(
                FieldError(path, "customer_mismatch", f"run {subject} belongs to another customer")
            )
    if errors:
        raise validation_error(errors)
    return run_ids


def _split_outcomes(
    rows: Sequence[tuple[Any, ...]],
) -> tuple[dict[EventKey, int], dict[EventKey, bytes]]:
    """The events this request inserted (key → pk) and the ones stored before (→ hash)."""
    inserted: dict[EventKey, int] = {}
    stored: dict[EventKey, bytes] = {}
    for source, event_id, pk, body_hash in rows:
        if pk is not None:
            inserted[(source, event_id)] = pk
        else:
            stored[(source, event_id)] = bytes(body_hash)
    return inserted, stored


def _reject_conflicts(
    conn: psycopg.Connection[Any],
    tenant_id: str,
    events: Sequence[ValidEvent],
    inserted: dict[EventKey, int],
    stored: dict[EventKey, bytes],
) -> None:
    """An id already stored with other content is a 409 for the whole request."""
    repeated = [e for e in events if (e.source, e.id) not in inserted]
    unseen = [e for e in repeated if (e.source, e.id) not in stored]
    if unseen:  # stored by a concurrent request after our snapshot: look again
        rows = conn.execute(
            EXISTING_HASHES,
            {
                "tenant": tenant_id,
                "sources": [e.source for e in unseen],
                "ids": [e.id for e in unseen],
            },
        ).fetchall()
        stored = {**stored, **{(source, eid): bytes(h) for source, eid, h in rows}}
    clashes = [
        f"{e.source}/{e.id}" for e in repeated if stored.get((e.source, e.id)) != e.body_hash
    ]
    if clashes:
        raise conflict(
            "an event with this id was already accepted with different content",
            code="event_conflict",
            conflicting_ids=clashes,
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
