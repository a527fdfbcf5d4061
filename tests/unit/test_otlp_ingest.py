"""Mapped spans → ingest (metering/ingest/spans.py): an event ingest refuses refuses its own
span, with a reason naming it, and the rest of the export is kept (docs/otlp.md)."""

from __future__ import annotations

from datetime import UTC, datetime

from metering.config import Settings
from metering.ingest.spans import by_run, partial_success_message, prepare_spans
from metering.otlp import map_spans
from metering.prices import CatalogCache
from metering.pricing import PriceCatalog
from tests.helpers.catalog import stable_prices
from tests.helpers.otlp import Backend

CATALOGS = CatalogCache(lambda: PriceCatalog.from_prices(stable_prices()))


def export_of_two_runs() -> list[dict[str, object]]:
    backend = Backend(response_model="agent-large-1", **{"fairmeter.customer.id": "cust-1"})
    for run in ("run-a", "run-b"):
        with backend.baggage(**{"fairmeter.run.id": run}), backend.agent():
            backend.chat(input_tokens=100, output_tokens=10)
    return list(map_spans(backend.export()).events)


def test_an_event_ingest_refuses_is_dropped_alone_with_a_reason_naming_it() -> None:
    events = export_of_two_runs()
    events[0] = {**events[0], "data": {**events[0]["data"], "model": "no-such-model"}}  # type: ignore[dict-item]

    prepared = prepare_spans(events, "acme", datetime.now(UTC), Settings(), CATALOGS)

    assert [event.index for event in prepared.request.events] == [1, 2, 3]
    assert len(prepared.refused) == 1
    assert prepared.refused[0].startswith(f"event {events[0]['id']}: data.model: ")
    assert sorted(prepared.request.prices) == [2]  # the other run's model call is priced


def test_by_run_splits_a_request_into_one_per_run() -> None:
    prepared = prepare_spans(export_of_two_runs(), "acme", datetime.now(UTC), Settings(), CATALOGS)

    runs = by_run(prepared.request)

    assert [{event.subject for event in run.events} for run in runs] == [{"run-a"}, {"run-b"}]
    assert sum(len(run.events) for run in runs) == len(prepared.request.events) == 4


def test_the_message_names_the_first_three_reasons_and_counts_the_rest() -> None:
    assert partial_success_message(["a"]) == "1 span(s) rejected: a"
    message = partial_success_message(["a", "b", "c", "d", "e"])
    assert message == "5 span(s) rejected: a; b; c; and 2 more"
