"""The ingest use case: validate, price, store — in the caller's one transaction."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg

from metering.catalogue import USAGE_TYPE
from metering.config import Settings
from metering.errors import FieldError, validation_error
from metering.ingest.store import IngestResult, store_events
from metering.ingest.validation import TimeWindow, ValidEvent, validate_batch
from metering.prices import CatalogCache
from metering.pricing import PriceCatalog, PricedUsage, TokenCounts, UnknownModelError


@dataclass(frozen=True, slots=True)
class IngestRequest:
    tenant_id: str
    events: Sequence[Any]  # decoded JSON, one dict per CloudEvent
    single: bool  # structured/binary mode: paths read ``$`` instead of ``$[i]``
    received_at: datetime


def time_window(settings: Settings, now: datetime) -> TimeWindow:
    return TimeWindow(
        now=now,
        max_future=timedelta(seconds=settings.max_future_skew_s),
        max_age=timedelta(seconds=settings.max_event_age_s),
    )


def price_events(
    events: Sequence[ValidEvent], catalog: PriceCatalog, *, single: bool
) -> tuple[dict[int, PricedUsage], list[FieldError]]:
    """Price each usage event at its own time; unknown models are field errors."""
    prices: dict[int, PricedUsage] = {}
    errors: list[FieldError] = []
    for event in events:
        if event.type != USAGE_TYPE:
            continue
        data = event.data
        tokens = TokenCounts(
            input_tokens=data["input_tokens"],
            cached_input_tokens=data.get("cached_input_tokens", 0),
            output_tokens=data["output_tokens"],
        )
        try:
            prices[event.index] = catalog.price_usage(data["model"], tokens, event.time)
        except UnknownModelError as exc:
            path = "$.data.model" if single else f"$[{event.index}].data.model"
            errors.append(FieldError(path, "unknown_model", str(exc)))
    return prices, errors


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    """A request's events validated and priced: all that is left is to store them."""

    tenant_id: str
    events: Sequence[ValidEvent]
    prices: dict[int, PricedUsage]  # by event index
    single: bool
    received_at: datetime


def prepare_request(
    request: IngestRequest, settings: Settings, catalogs: CatalogCache
) -> PreparedRequest:
    """Validate and price a request's events; raise on any bad event (nothing is stored)."""
    valid = _validate(request, settings)
    prices, errors = price_events(valid, catalogs.current(), single=request.single)
    if errors:  # a model may have been added since the cache was filled
        prices, errors = price_events(valid, catalogs.refresh(), single=request.single)
    if errors:
        raise validation_error(errors)
    return PreparedRequest(request.tenant_id, valid, prices, request.single, request.received_at)


def prepare_with_catalog(
    request: IngestRequest, settings: Settings, catalog: PriceCatalog
) -> PreparedRequest | None:
    """``prepare_request`` with the catalog at hand and no database access: ``None`` when a
    model is unknown to ``catalog``, which may be stale (``prepare_request`` reloads it)."""
    valid = _validate(request, settings)
    prices, errors = price_events(valid, catalog, single=request.single)
    if errors:
        return None
    return PreparedRequest(request.tenant_id, valid, prices, request.single, request.received_at)


def _validate(request: IngestRequest, settings: Settings) -> list[ValidEvent]:
    window = time_window(settings, request.received_at)
    valid, errors = validate_batch(request.events, window, single=request.single)
    if errors:
        raise validation_error(errors)
    return valid


def store_prepared(
    conn: psycopg.Connection[Any],
    prepared: PreparedRequest,
    known_customers: set[str] | None = None,
) -> IngestResult:
    """Store one prepared request in the caller's transaction (see ``store_events``)."""
    return store_events(
        conn,
        prepared.tenant_id,
        prepared.events,
        prepared.prices,
        prepared.received_at,
        known_customers=known_customers,
        single=prepared.single,
    )


def ingest_events(
    conn: psycopg.Connection[Any],
    request: IngestRequest,
    settings: Settings,
    catalogs: CatalogCache,
    known_customers: set[str] | None = None,
) -> IngestResult:
    """Validate and store a request's events atomically; raise on any bad event."""
    prepared = prepare_request(request, settings, catalogs)
    return store_prepared(conn, prepared, known_customers)
