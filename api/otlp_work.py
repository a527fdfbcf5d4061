"""An OTLP export's work away from the API process: decoded, mapped, validated, priced and
stored by a worker process (api/cpu_pool.py), on a connection of its own.

Every step of a large export is Python work per span: decoding (~0.7 s for 2,048 spans as
OTLP/JSON, 2 ms as protobuf), mapping (~0.2 s), validating (~0.1 s), pricing and building
the store's rows (~0.2 s). Run on a thread of the API process, the last of them still held
that process's GIL beside every other tenant's requests (issue #30: another tenant's ingest
p99 ×3.2 next to one tenant's exports). So a worker does all of it, at the lower priority
it started with, and hands back only what the reply and the metrics need: a few counts and
the refusals' reasons.

The worker's connection is named ``fairmeter-otlp-<tag>-<pid>`` (``application_name``) and
bounded by the export's statement and lock timeouts: an export cancelled in the API process
(its exporter gone, its time up) has that backend terminated by name
(``metering.db.terminate_backends``), which rolls back what it was storing. This module
imports no web framework, so a worker loads little.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Final

import psycopg

from metering.errors import MeteringError, unstorable_value
from metering.ingest.service import PreparedRequest, store_prepared
from metering.ingest.spans import (
    ValidatedSpans,
    by_run,
    price_spans,
    refused_reasons,
    run_refused_reasons,
    validate_spans,
)
from metering.ingest.store import STORE_ATTEMPTS, UNSTORABLE_VALUES, IngestResult
from metering.ingest.validation import TimeWindow
from metering.otlp import MappedSpans, map_spans
from metering.otlp.export import check_span_count, decode_export
from metering.prices import CatalogCache, load_catalog
from metering.pricing import PriceCatalog

# A worker's backend is named this, the export's tag and the worker's OS pid.
EXPORT_APPLICATION: Final = "fairmeter-otlp-"


@dataclass(frozen=True, slots=True)
class CheckedExport:
    """What an export means, before pricing."""

    mapped: MappedSpans  # how every span was treated; ``events`` left out (``spans`` has them)
    spans: ValidatedSpans


def check_export(
    body: bytes, *, as_json: bool, max_spans: int, window: TimeWindow
) -> CheckedExport:
    """Decode, bound, map and validate an (inflated) body. Raises ``MeteringError``: 400 for
    a body that is not an export, 413 for one of more than ``max_spans`` spans."""
    export = decode_export(body, as_json=as_json)
    check_span_count(export, max_spans)
    mapped = map_spans(export)
    return CheckedExport(replace(mapped, events=()), validate_spans(mapped.events, window))


@dataclass(frozen=True, slots=True)
class ExportJob:
    """A large export, as a worker stores it: the (inflated) body and what ingest needs."""

    body: bytes
    as_json: bool
    max_spans: int
    window: TimeWindow
    tenant_id: str
    received_at: datetime
    conninfo: str  # libpq URL
    tag: str  # names the worker's backend, for cancelling it
    options: str  # libpq options: the session's, and the export's statement and lock timeouts


@dataclass(frozen=True, slots=True)
class StoredExport:
    """What the reply and the metrics need of a stored export."""

    mapped: MappedSpans  # how every span was treated (``events`` left out)
    refused: tuple[str, ...]  # a reason per span that validation or pricing refused
    accepted: int  # events stored now
    duplicates: int  # events stored before (a retried export)
    refused_at_store: tuple[str, ...]  # a reason per span whose event the store refused
    rejections: tuple[tuple[int, str], ...]  # (events, code) per run the store refused


def store_export(job: ExportJob) -> StoredExport:
    """Check, price and store ``job``'s export (raises ``MeteringError`` 400/413 for a body
    that is not an export, ``psycopg`` errors for a database that cannot serve it).

    Stored as ``POST /v1/events`` stores a request, alone (no group commit: it is large) in
    one transaction. When the store refuses the export as a whole (an event id already
    stored with other content; a run owned by another customer), each run is stored on its
    own, so that only the runs at fault are refused."""
    checked = check_export(
        job.body, as_json=job.as_json, max_spans=job.max_spans, window=job.window
    )
    name = f"{EXPORT_APPLICATION}{job.tag}-{os.getpid()}"
    with psycopg.connect(
        job.conninfo,
        options=job.options,
        connect_timeout=10,
        application_name=name,
        autocommit=True,  # each store below is a transaction of its own
    ) as conn:
        catalogs = _catalogs(job.conninfo, job.options)
        prepared = price_spans(checked.spans, job.tenant_id, job.received_at, catalogs)
        events = prepared.request
        if not events.events:
            return StoredExport(checked.mapped, prepared.refused, 0, 0, (), ())
        try:
            result = _store_alone(conn, events)
            return StoredExport(
                checked.mapped,
                prepared.refused,
                result.accepted,
                result.duplicates,
                tuple(refused_reasons(result)),
                (),
            )
        except MeteringError:
            pass
        accepted = duplicates = 0
        reasons: list[str] = []
        rejections: list[tuple[int, str]] = []
        for run in by_run(events):
            try:
                result = _store_alone(conn, run)
            except MeteringError as refusal:
                rejections.append((len(run.events), refusal.code))
                reasons.extend(run_refused_reasons(run, refusal))
                continue
            accepted, duplicates = accepted + result.accepted, duplicates + result.duplicates
            reasons.extend(refused_reasons(result))
        return StoredExport(
            checked.mapped,
            prepared.refused,
            accepted,
            duplicates,
            tuple(reasons),
            tuple(rejections),
        )


def _store_alone(conn: psycopg.Connection[Any], prepared: PreparedRequest) -> IngestResult:
    """``prepared`` in a transaction of its own; a refused value is a 400 (``MeteringError``),
    a deadlock is tried again."""
    for attempt in range(1, STORE_ATTEMPTS + 1):
        try:
            with conn.transaction():
                return store_prepared(conn, prepared)
        except UNSTORABLE_VALUES:
            raise unstorable_value() from None
        except psycopg.errors.TransactionRollback:
            if attempt == STORE_ATTEMPTS:
                raise
    raise AssertionError("unreachable: the last attempt returns or raises")


_catalog_caches: dict[str, CatalogCache] = {}
_catalog_lock = threading.Lock()


def _catalogs(conninfo: str, options: str) -> CatalogCache:
    """This process's price catalog of the database at ``conninfo``, cached as the API
    process caches its own (``CatalogCache``'s TTL; refreshed when a model is unknown)."""
    with _catalog_lock:
        cache = _catalog_caches.get(conninfo)
        if cache is None:

            def load() -> PriceCatalog:
                with psycopg.connect(conninfo, options=options, connect_timeout=10) as conn:
                    return load_catalog(conn)

            cache = _catalog_caches[conninfo] = CatalogCache(load)
        return cache
