"""Ingesting events straight through the use case (no HTTP), for settlement tests."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from metering.config import Settings
from metering.db import raw_transaction
from metering.ingest.service import IngestRequest, ingest_events
from metering.ingest.store import IngestResult
from metering.keys_repo import ensure_tenant
from metering.prices import CatalogCache, load_catalog


def ingest(
    engine: Any,
    settings: Settings,
    events: list[dict[str, Any]],
    *,
    tenant: str = "acme",
    received_at: datetime | None = None,
) -> IngestResult:
    def load() -> Any:
        with raw_transaction(engine) as conn:
            return load_catalog(conn)

    with raw_transaction(engine) as conn:
        ensure_tenant(conn, tenant)
        request = IngestRequest(
            tenant_id=tenant,
            events=events,
            single=False,
            received_at=received_at or datetime.now(UTC),
        )
        return ingest_events(conn, request, settings, CatalogCache(load))
