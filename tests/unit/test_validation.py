"""Pure CloudEvent validation: canonical form, content hash and error paths."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from freezegun import freeze_time

from metering.ingest.validation import TimeWindow, ValidEvent, validate_batch, validate_event

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
WINDOW = TimeWindow(now=NOW, max_future=timedelta(minutes=5), max_age=timedelta(days=35))


def raw(**overrides):
    event = {
        "specversion": "1.0",
        "id": "e1",
        "source": "s",
        "type": "run.heartbeat",
        "subject": "r1",
        "time": "2026-11-30T11:59:00Z",
        "data": {"customer": "c"},
    }
    event.update(overrides)
    return event


def test_same_event_in_structured_and_binary_shape_has_the_same_hash():
    structured = validate_event(raw(), "$", 0, WINDOW)
    binary = validate_event(
        raw(time="2026-11-30T11:59:00.000000+00:00", datacontenttype="application/json"),
        "$",
        0,
        WINDOW,
    )
    assert isinstance(structured, ValidEvent) and isinstance(binary, ValidEvent)
    assert structured.body_hash == binary.body_hash


def test_different_data_gives_a_different_hash():
    a = validate_event(raw(), "$", 0, WINDOW)
    b = validate_event(raw(data={"customer": "d"}), "$", 0, WINDOW)
    assert isinstance(a, ValidEvent) and isinstance(b, ValidEvent)
    assert a.body_hash != b.body_hash


def test_time_window_boundaries_are_inclusive():
    at_future_edge = raw(time="2026-11-30T12:05:00Z")
    past_future_edge = raw(time="2026-11-30T12:05:00.000001Z")
    at_age_edge = raw(time="2026-10-26T12:00:00Z")
    past_age_edge = raw(time="2026-10-26T11:59:59.999999Z")
    assert isinstance(validate_event(at_future_edge, "$", 0, WINDOW), ValidEvent)
    assert validate_event(past_future_edge, "$", 0, WINDOW)[0].code == "time_in_future"
    assert isinstance(validate_event(at_age_edge, "$", 0, WINDOW), ValidEvent)
    assert validate_event(past_age_edge, "$", 0, WINDOW)[0].code == "time_too_old"


@freeze_time("2026-11-30T12:00:00Z")
def test_window_follows_the_clock():
    now = datetime.now(UTC)
    window = TimeWindow(now=now, max_future=timedelta(minutes=5), max_age=timedelta(days=35))
    assert isinstance(validate_event(raw(), "$", 0, window), ValidEvent)


def test_batch_errors_carry_the_index_of_the_event():
    _, errors = validate_batch([raw(), raw(id=""), raw(specversion="0.3")], WINDOW)
    assert [(e.path, e.code) for e in errors] == [
        ("$[1].id", "invalid_type"),
        ("$[2].specversion", "invalid_value"),
    ]


def test_extension_attributes_are_kept_and_hashed():
    event = validate_event(raw(traceparent="00-abc"), "$", 0, WINDOW)
    assert isinstance(event, ValidEvent)
    assert event.attributes["traceparent"] == "00-abc"


def test_badly_named_extension_is_refused():
    errors = validate_event(raw(**{"Bad-Name": "x"}), "$", 0, WINDOW)
    assert isinstance(errors, list) and errors[0].code == "invalid_name"


def test_binary_data_is_refused():
    errors = validate_event(raw(data_base64="AAAA"), "$", 0, WINDOW)
    assert isinstance(errors, list) and errors[0].path == "$.data_base64"
