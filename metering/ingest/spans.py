"""Ingest mapped OTLP spans: the same validation, pricing and store as ``POST /v1/events``.

One difference, and it is OTLP's: a CloudEvents batch is all or nothing (the client fixes it
and resends), but an exporter never fixes a batch — it retries it or drops it. So an event
that ingest refuses here refuses only its own span, reported in the response's
``partial_success``, and the rest of the export is stored. The events stay those the
mapping made, so a retried export is the same events again: duplicates, never a second
charge.

Two steps: ``validate_spans`` (no database, no catalog: with the decoding and mapping
before it, api/otlp_work.py, most of an export's CPU time, which an API process runs in
another process, api/cpu_pool.py) and ``price_spans`` (the price catalog).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Final

from metering.catalogue import OTLP
from metering.config import Settings
from metering.errors import FieldError
from metering.ingest.outcomes import IngestResult
from metering.ingest.service import PreparedRequest, price_events, time_window
from metering.ingest.validation import TimeWindow, ValidEvent, validate_batch
from metering.prices import CatalogCache

# How many reasons the response's error_message names: enough to fix a backend, short
# enough for an exporter's log line.
REASONS_IN_MESSAGE: Final = 3


@dataclass(frozen=True, slots=True)
class PreparedSpans:
    """An export ready to store: the events ingest accepts, and a reason per refused span."""

    request: PreparedRequest
    refused: tuple[str, ...]  # one reason per span whose event ingest refuses


@dataclass(frozen=True, slots=True)
class ValidatedSpans:
    """The events mapped from an export's spans, validated, not yet priced (picklable: a
    worker process may validate them, api/otlp_work.py)."""

    valid: tuple[ValidEvent, ...]  # the events validation accepts
    refused: dict[int, str]  # a reason per event index validation refuses


def validate_spans(events: Sequence[dict[str, Any]], window: TimeWindow) -> ValidatedSpans:
    """Validate each event mapped from a span on its own; a refused event refuses its span."""
    valid, errors = validate_batch(events, window)
    refused = _reasons_by_index(errors, lambda index: events[index].get("id", "?"))
    return ValidatedSpans(tuple(e for e in valid if e.index not in refused), refused)


def price_spans(
    spans: ValidatedSpans, tenant_id: str, received_at: datetime, catalogs: CatalogCache
) -> PreparedSpans:
    """Price each validated event on its own; an event whose model is unknown refuses its
    span."""
    priceable = spans.valid
    prices, price_errors = price_events(priceable, catalogs.current(), single=False)
    if price_errors:  # a model may have been added since the cache was filled
        prices, price_errors = price_events(priceable, catalogs.refresh(), single=False)
    ids = {event.index: event.id for event in priceable}
    refused = {**spans.refused, **_reasons_by_index(price_errors, ids.__getitem__)}
    accepted = [replace(e, protocol=OTLP) for e in priceable if e.index not in refused]
    request = PreparedRequest(tenant_id, accepted, prices, single=False, received_at=received_at)
    return PreparedSpans(request, tuple(refused[index] for index in sorted(refused)))


def prepare_spans(
    events: Sequence[dict[str, Any]],
    tenant_id: str,
    received_at: datetime,
    settings: Settings,
    catalogs: CatalogCache,
) -> PreparedSpans:
    """Validate and price each event mapped from a span (``metering.otlp.map_spans``) on
    its own; a refused event refuses its span."""
    spans = validate_spans(events, time_window(settings, received_at))
    return price_spans(spans, tenant_id, received_at, catalogs)


def _reasons_by_index(errors: list[FieldError], event_id: Callable[[int], Any]) -> dict[int, str]:
    """Ingest's field errors (paths ``$[i].…``) → one reason per refused event index."""
    reasons: dict[int, str] = {}
    for error in errors:
        position, _, field = error.path.removeprefix("$[").partition("]")
        index = int(position)
        reasons.setdefault(index, f"event {event_id(index)}: {field.lstrip('.')}: {error.message}")
    return reasons


def by_run(request: PreparedRequest) -> list[PreparedRequest]:
    """The request split into one request per run, each storable on its own: when the store
    refuses a whole request (an event id already stored with other content, a run owned by
    another customer), only the runs at fault are refused."""
    runs: dict[str, list[ValidEvent]] = defaultdict(list)
    for event in request.events:
        runs[event.subject].append(event)
    return [replace(request, events=events) for events in runs.values()]


def refused_reasons(result: IngestResult) -> list[str]:
    """A reason per span whose event the store refused (usage its run takes through
    CloudEvents: ``metering.ingest.protocol``), for the response's ``partial_success``."""
    return [f"event {o.id}: {o.reason}" for o in result.events if o.result == "refused"]


def run_refused_reasons(run: PreparedRequest, refusal: Exception) -> list[str]:
    """A reason per span of ``run`` when the store refused the run as a whole."""
    subject = run.events[0].subject
    return [f"event {event.id} of run {subject}: {refusal}" for event in run.events]


def partial_success_message(reasons: list[str]) -> str:
    """The response's ``error_message``: how many spans were rejected and the first reasons."""
    shown = "; ".join(reasons[:REASONS_IN_MESSAGE])
    more = len(reasons) - REASONS_IN_MESSAGE
    tail = f"; and {more} more" if more > 0 else ""
    return f"{len(reasons)} span(s) rejected: {shown}{tail}"
