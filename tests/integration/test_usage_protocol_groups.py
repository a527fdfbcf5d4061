"""One protocol per run's usage holds inside a group commit (metering/ingest/group.py): a
CloudEvents request and an OTLP export bringing one run its first usage in one shared
transaction leave one winner, in arrival order, and the others' answers are their own."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from api.ingest_group import store_group
from metering.db import raw_transaction
from metering.ingest.service import IngestRequest, PreparedRequest, prepare_request
from metering.ingest.spans import prepare_spans
from metering.ingest.store import IngestResult
from metering.keys_repo import ensure_tenant
from metering.prices import CatalogCache, load_catalog
from tests.helpers.events import usage


@pytest.fixture
def catalogs(engine: Any, db: Any) -> CatalogCache:
    with raw_transaction(engine) as conn:
        ensure_tenant(conn, "acme")

    def load() -> Any:
        with raw_transaction(engine) as conn:
            return load_catalog(conn)

    return CatalogCache(load)


def as_event(settings: Any, catalogs: CatalogCache, run: str, **extra: Any) -> PreparedRequest:
    """A CloudEvents request of one model call."""
    request = IngestRequest(
        "acme", [usage(run=run, **extra)], single=False, received_at=datetime.now(UTC)
    )
    return prepare_request(request, settings, catalogs)


def as_span(settings: Any, catalogs: CatalogCache, run: str) -> PreparedRequest:
    """An OTLP export of one model call, as ``metering.otlp.map_spans`` maps it."""
    mapped = usage(run=run, id=f"{run}-trace-span-usage", source="otlp/support-agent")
    prepared = prepare_spans([mapped], "acme", datetime.now(UTC), settings, catalogs)
    assert prepared.refused == ()
    return prepared.request


def answers(outcomes: list[Any]) -> list[Any]:
    return [
        [e.result for e in o.events] if isinstance(o, IngestResult) else o.code for o in outcomes
    ]


def test_a_group_with_a_run_s_usage_through_both_protocols_keeps_the_first(
    engine, settings, catalogs, db
):
    outcomes = store_group(
        engine,
        [
            as_event(settings, catalogs, "g-event-first"),
            as_span(settings, catalogs, "g-event-first"),
            as_span(settings, catalogs, "g-span-first"),
            as_event(settings, catalogs, "g-span-first"),
            as_event(settings, catalogs, "g-bystander", customer="cust-2"),
        ],
    )

    assert answers(outcomes) == [
        ["accepted"],
        ["refused"],
        ["accepted"],
        "usage_protocol_conflict",
        ["accepted"],
    ]
    [refused] = outcomes[1].events
    assert "run g-event-first's usage came through CloudEvents" in refused.reason
    assert (outcomes[1].accepted, outcomes[1].duplicates) == (0, 0)
    stored = db.execute(
        "SELECT r.subject, r.usage_protocol, count(u.id) FROM runs r "
        "LEFT JOIN usage_lines u ON u.run_id = r.id GROUP BY 1, 2 ORDER BY 1"
    ).fetchall()
    assert stored == [
        ("g-bystander", "cloudevents", 1),
        ("g-event-first", "cloudevents", 1),
        ("g-span-first", "otlp", 1),
    ]


def test_a_span_refused_inside_a_shared_transaction_leaves_the_others_stored(
    engine, settings, catalogs, db
):
    outcomes = store_group(
        engine,
        [
            as_event(settings, catalogs, "g-shared"),
            as_span(settings, catalogs, "g-shared"),
            as_event(settings, catalogs, "g-shared-bystander"),
        ],
    )

    assert answers(outcomes) == [["accepted"], ["refused"], ["accepted"]]
    assert [(o.accepted, o.duplicates) for o in outcomes] == [(1, 0), (0, 0), (1, 0)]
    lines = db.execute("SELECT count(*) FROM usage_lines").fetchone()[0]
    assert lines == 2
