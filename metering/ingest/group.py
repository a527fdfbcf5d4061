"""Group commit: several small ingest requests stored as one, in one transaction.

Under load, most of a single event's cost is per statement and per transaction, not per
event (docs/benchmarks.md, Ingest): a request of one event costs PostgreSQL about ten times
what one event of a 1,000-event batch does. Storing the requests that arrive while a commit
is in flight together keeps every request's guarantees:

- durability: each request's reply still waits for the commit that holds its events;
- idempotency: an event sent in two requests of one group is stored once, the later
  request's copy reported as a duplicate, exactly as if they had come one after another;
- atomicity: a request whose events would fail (409 ``event_conflict``, 422
  ``customer_mismatch``) fails the combined statement; the caller then rolls back and
  stores the group's requests one by one, so only the failing request fails;
- isolation: the same holds for any other error of the combined transaction (a value the
  database refuses, a deadlock): no request is ever answered with another's error. Values
  PostgreSQL cannot store are refused by validation, before any transaction, so that one
  tenant's bad input does not even cost the others a retry.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import psycopg

from metering.errors import FieldError, validation_error
from metering.ingest.outcomes import IngestResult, result_of
from metering.ingest.service import PreparedRequest
from metering.ingest.store import store_events
from metering.ingest.validation import ValidEvent
from metering.pricing import PricedUsage


def store_together(
    conn: psycopg.Connection[Any], requests: Sequence[PreparedRequest]
) -> list[IngestResult]:
    """Store ``requests`` as one request per tenant, in the caller's transaction.

    Returns each request's own result, in order. Raises whatever ``store_events`` raises for
    the combination; the caller must then roll back (nothing of the group is kept).
    Tenants go in name order, so two groups take their locks in one global order.
    """
    results: dict[int, IngestResult] = {}
    by_tenant: dict[str, list[int]] = {}
    for position, request in enumerate(requests):
        by_tenant.setdefault(request.tenant_id, []).append(position)
    for tenant in sorted(by_tenant):
        members = [requests[p] for p in by_tenant[tenant]]
        events, prices, spans = _combine(members)
        received_at = max(r.received_at for r in members)
        combined = store_events(conn, tenant, events, prices, received_at)
        for position, (start, end) in zip(by_tenant[tenant], spans, strict=True):
            results[position] = _result(combined, start, end)
    return [results[p] for p in range(len(requests))]


def _combine(
    requests: Sequence[PreparedRequest],
) -> tuple[list[ValidEvent], dict[int, PricedUsage], list[tuple[int, int]]]:
    """One event list for several requests, re-indexed; each request's slice of it.

    Validation checked that each request names one customer per run; across requests that
    is checked here, since the store compares only a run's first event with its owner.
    """
    events: list[ValidEvent] = []
    prices: dict[int, PricedUsage] = {}
    spans = []
    owners: dict[str, str] = {}
    for request in requests:
        start = len(events)
        for event in request.events:
            if owners.setdefault(event.subject, event.customer) != event.customer:
                raise validation_error(
                    [FieldError("$", "customer_mismatch", f"run {event.subject}: two customers")]
                )
            index = len(events)
            events.append(replace(event, index=index))
            if event.index in request.prices:
                prices[index] = request.prices[event.index]
        spans.append((start, len(events)))
    return events, prices, spans


def _result(combined: IngestResult, start: int, end: int) -> IngestResult:
    return result_of(combined.events[start:end])
