"""The one-protocol rule on its own (metering/ingest/protocol.py): which events a run with a
recorded usage protocol takes, and how the others are refused."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from metering.catalogue import OTLP
from metering.errors import MeteringError
from metering.ingest.protocol import first_usage_protocol, screen_usage
from metering.ingest.validation import TimeWindow, ValidEvent, validate_batch
from tests.helpers.events import event, usage


def window() -> TimeWindow:
    """The ingest window as of the call: one taken when the module was collected is
    minutes old by the time a full suite runs these, and the events' times then read as
    too far in the future (it failed so in CI)."""
    return TimeWindow(datetime.now(UTC), timedelta(minutes=5), timedelta(days=35))


def valid(*raws: dict[str, object], single: bool = False) -> list[ValidEvent]:
    events, errors = validate_batch(list(raws), window(), single=single)
    assert errors == []
    return events


def as_spans(events: list[ValidEvent]) -> list[ValidEvent]:
    return [replace(e, protocol=OTLP) for e in events]


def test_a_run_records_the_protocol_of_its_first_usage_not_of_its_first_event() -> None:
    spans = as_spans(valid(event(type="run.tool_call", step=1, tool_call_id="c", status="failed")))
    assert first_usage_protocol(spans) is None
    assert first_usage_protocol([*spans, *valid(usage()), *as_spans(valid(usage()))]) == (
        "cloudevents"
    )


def test_spans_of_a_cloudevents_run_lose_their_usage_and_keep_their_lifecycle() -> None:
    spans = as_spans(valid(usage(run="r"), event(type="run.completed", run="r"), usage(run="o")))

    screened = screen_usage(spans, {"r": "cloudevents", "o": None}, single=False)

    assert [(e.type, e.subject) for e in screened.events] == [
        ("run.completed", "r"),
        ("run.usage", "o"),
    ]
    [(key, reason)] = screened.refused.items()
    assert key == (spans[0].source, spans[0].id)
    assert reason.startswith("run r's usage came through CloudEvents, POST /v1/events first")


def test_a_cloudevent_s_usage_for_an_otlp_run_is_a_422_at_its_subject() -> None:
    for single, path in ((True, "$.subject"), (False, "$[1].subject")):
        events = (
            valid(usage(run="r"), single=True)
            if single
            else valid(event(type="run.started", run="r"), usage(run="r"))
        )
        with pytest.raises(MeteringError) as refused:
            screen_usage(events, {"r": OTLP}, single=single)
        assert (refused.value.status, refused.value.code) == (422, "usage_protocol_conflict")
        assert [e.path for e in refused.value.errors] == [path]
