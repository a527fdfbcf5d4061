"""Meters, meter events, summaries, identifier dedupe, idempotency and the time windows."""

from __future__ import annotations

import pytest
import stripe

from devtools.stripe_emulator import EmulatorServer
from devtools.stripe_emulator.control_client import EmulatorControl
from tests.devtools.stripe_emulator.harness import EVENT_NAME, SendEvent

DAY_S = 86400


@pytest.fixture(autouse=True)
def _sync_validation(control: EmulatorControl) -> None:
    """These tests assert the 400s of synchronous validation (the default is async, tested in
    test_async_validation.py) and read summaries at once (the lag: test_summary_lag.py)."""
    control.settings(validation_mode="sync", summary_lag_s=0)


def _summaries(
    client: stripe.StripeClient, meter_id: str, customer_id: str, start: int, end: int
) -> list[tuple[int, int]]:
    page = client.v1.billing.meters.event_summaries.list(
        meter_id,
        params={
            "customer": customer_id,
            "start_time": start,
            "end_time": end,
            "value_grouping_window": "hour",
        },
    )
    return [(row.start_time, int(row.aggregated_value)) for row in page.auto_paging_iter()]


def test_meter_and_customer_are_created_listed_and_retrieved(
    client: stripe.StripeClient, meter: stripe.billing.Meter, customer: stripe.Customer
) -> None:
    assert meter.id.startswith("mtr_") and meter.status == "active"
    assert [m.id for m in client.v1.billing.meters.list().data] == [meter.id]
    assert client.v1.billing.meters.retrieve(meter.id).event_name == EVENT_NAME
    fetched = client.v1.customers.retrieve(customer.id)
    assert (fetched.email, fetched.balance) == ("ops@example.com", 0)


def test_accepted_event_is_summed_by_timestamp_into_hourly_summaries(
    client: stripe.StripeClient,
    meter: stripe.billing.Meter,
    customer: stripe.Customer,
    send_event: SendEvent,
    hour: int,
) -> None:
    event = send_event("run:1:v1", 12, timestamp=hour + 60)
    send_event("run:2:v1", 30, timestamp=hour + 900)
    send_event("run:3:v1", 5, timestamp=hour - 1)

    assert event.object == "billing.meter_event"
    assert (event.identifier, event.payload["value"], event.timestamp) == (
        "run:1:v1",
        "12",
        hour + 60,
    )
    assert _summaries(client, meter.id, customer.id, hour - 3600, hour + 3600) == [
        (hour - 3600, 5),
        (hour, 42),
    ]


def test_summary_times_must_be_aligned_to_the_grouping_window(
    client: stripe.StripeClient, meter: stripe.billing.Meter, customer: stripe.Customer, hour: int
) -> None:
    with pytest.raises(stripe.InvalidRequestError) as raised:
        _summaries(client, meter.id, customer.id, hour + 60, hour + 3600)
    assert raised.value.param == "start_time"


def test_repeated_identifier_is_refused_with_stripes_message(send_event: SendEvent) -> None:
    send_event("run:7:v1", 3)

    with pytest.raises(stripe.InvalidRequestError) as raised:
        send_event("run:7:v1", 3)

    assert raised.value.http_status == 400
    assert raised.value.user_message == "An event already exists with identifier run:7:v1."


def test_identifier_may_be_reused_once_the_dedupe_window_has_passed(
    send_event: SendEvent, control: EmulatorControl
) -> None:
    send_event("run:8:v1", 3)
    control.advance_clock(DAY_S)

    send_event("run:8:v1", 3)

    assert [e["identifier"] for e in control.state()["meter_events"]] == ["run:8:v1"] * 2


def test_same_idempotency_key_replays_the_first_response(
    send_event: SendEvent, server: EmulatorServer
) -> None:
    first = send_event("run:9:v1", 4, key="outbox:9")
    again = send_event("run:9:v1", 4, key="outbox:9")

    assert again.to_dict() == first.to_dict()
    assert again.last_response.headers["Idempotent-Replayed"] == "true"
    assert len(server.state.meter_events) == 1


def test_same_idempotency_key_with_other_params_is_an_idempotency_error(
    send_event: SendEvent, server: EmulatorServer
) -> None:
    send_event("run:10:v1", 4, key="outbox:10")

    with pytest.raises(stripe.IdempotencyError) as raised:
        send_event("run:10:v1", 5, key="outbox:10")

    assert "same parameters" in raised.value.user_message
    assert [e.value for e in server.state.meter_events] == [4]


def test_timestamp_older_than_35_days_is_refused(send_event: SendEvent, hour: int) -> None:
    with pytest.raises(stripe.InvalidRequestError) as raised:
        send_event("run:11:v1", timestamp=hour + 600 - 35 * DAY_S - 1)
    assert raised.value.param == "timestamp"

    send_event("run:12:v1", timestamp=hour + 600 - 35 * DAY_S)


def test_timestamp_more_than_5_minutes_ahead_is_refused(send_event: SendEvent, hour: int) -> None:
    with pytest.raises(stripe.InvalidRequestError):
        send_event("run:13:v1", timestamp=hour + 600 + 301)


def test_negative_value_is_refused_unless_the_setting_allows_it(
    send_event: SendEvent, control: EmulatorControl
) -> None:
    with pytest.raises(stripe.InvalidRequestError) as raised:
        send_event("run:14:v1", -3)
    assert raised.value.param == "payload[value]"

    control.settings(allow_negative_values=True)
    assert send_event("run:14:v1", -3).payload["value"] == "-3"


def test_event_for_an_unknown_event_name_is_refused(
    client: stripe.StripeClient, customer: stripe.Customer
) -> None:
    with pytest.raises(stripe.InvalidRequestError) as raised:
        client.v1.billing.meter_events.create(
            params={
                "event_name": "no_such_meter",
                "payload": {"stripe_customer_id": customer.id, "value": "1"},
            }
        )
    assert raised.value.param == "event_name"


def test_cancel_within_24_hours_removes_the_value_from_summaries(
    client: stripe.StripeClient,
    meter: stripe.billing.Meter,
    customer: stripe.Customer,
    send_event: SendEvent,
    control: EmulatorControl,
    hour: int,
) -> None:
    send_event("run:15:v1", 10)
    send_event("run:16:v1", 7)
    control.advance_clock(DAY_S - 1)

    adjustment = client.v1.billing.meter_event_adjustments.create(
        params={"event_name": EVENT_NAME, "type": "cancel", "cancel": {"identifier": "run:15:v1"}}
    )

    assert (adjustment.object, adjustment.status) == ("billing.meter_event_adjustment", "pending")
    assert _summaries(client, meter.id, customer.id, hour, hour + 3600) == [(hour, 7)]
    assert [e["cancelled"] for e in control.state()["meter_events"]] == [True, False]


def test_cancel_after_24_hours_is_refused(
    client: stripe.StripeClient, send_event: SendEvent, control: EmulatorControl
) -> None:
    send_event("run:17:v1", 10)
    control.advance_clock(DAY_S + 1)

    with pytest.raises(stripe.InvalidRequestError) as raised:
        client.v1.billing.meter_event_adjustments.create(
            params={
                "event_name": EVENT_NAME,
                "type": "cancel",
                "cancel": {"identifier": "run:17:v1"},
            }
        )

    assert "24 hours" in raised.value.user_message
    assert control.state()["meter_events"][0]["cancelled"] is False


def test_event_for_an_unknown_customer_is_accepted_but_flagged_and_not_summed(
    send_event: SendEvent, server: EmulatorServer
) -> None:
    send_event("run:18:v1", 3, customer_id="cus_missing")

    (event,) = server.state.meter_events
    assert event.error_code == "meter_event_customer_not_found"
    assert not event.counts
