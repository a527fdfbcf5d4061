"""Pure planning of Stripe calls: every path, and the money invariants under hypothesis."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from metering.billing.plan import (
    Carry,
    PlanInput,
    Sent,
    Step,
    live_events,
    plan,
    sent_total,
    within_any,
)

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
END = NOW - timedelta(hours=1)


def request(target: int, sent: list[Sent], **kw) -> PlanInput:
    defaults = dict(
        run_id=7, version=2, target_micros=target, sent=sent, now=NOW, carry=Carry(), event_time=END
    )
    defaults.update(kw)
    return PlanInput(**defaults)


def delivered(step: Step, at: datetime = NOW) -> Sent:
    stamp = datetime.fromtimestamp(step.timestamp, UTC) if step.timestamp else None
    return Sent(
        step.kind, step.identifier, step.micros, step.units, at, step.cancels_identifier, stamp
    )


def event(micros: int, age: timedelta, identifier: str = "run:7:v1") -> Sent:
    return Sent("meter_event", identifier, micros, micros, NOW - age)


def test_first_send_is_one_meter_event_with_deterministic_identifier():
    steps, carry = plan(request(1_500, []))
    assert steps == [
        Step("meter_event", "run:7:v2", 1_500, units=1_500, timestamp=int(END.timestamp()))
    ]
    assert carry == Carry()


def test_nothing_to_do_when_stripe_already_has_the_amount():
    assert plan(request(1_500, [event(1_500, timedelta(hours=1))]))[0] == []


def test_correction_within_24h_cancels_and_resends():
    steps, _ = plan(request(900, [event(1_500, timedelta(hours=23))]))
    assert [(s.kind, s.micros) for s in steps] == [("meter_cancel", -1_500), ("meter_event", 900)]
    assert steps[0].cancels_identifier == "run:7:v1"


def test_refund_within_24h_only_cancels():
    steps, _ = plan(request(0, [event(1_500, timedelta(hours=1))]))
    assert [s.kind for s in steps] == ["meter_cancel"]


def test_increase_after_24h_is_an_extra_event_for_the_difference():
    steps, _ = plan(request(2_000, [event(1_500, timedelta(hours=25))]))
    assert [(s.kind, s.identifier, s.micros) for s in steps] == [("meter_event", "run:7:v2", 500)]


def test_decrease_after_24h_is_a_credit_note_by_whole_units_with_the_rest_carried():
    steps, carry = plan(request(1_000, [event(1_500_000, timedelta(days=2))], unit_micros=10_000))
    # 1,499,000 micros = 149 units of 10,000 and 9,000 micros carried for the next credit;
    # never a customer balance credit (one per currency, applied to the next invoice).
    assert [(s.kind, s.units, s.micros) for s in steps] == [("credit_note", 149, -1_499_000)]
    assert steps[0].timestamp == int(END.timestamp())  # the invoice of the event's period
    assert carry == Carry(0, 9_000)
    steps, carry = plan(
        request(0, [event(1_000, timedelta(days=2))], carry=carry, unit_micros=10_000)
    )
    assert steps[0].units == 1 and carry == Carry(0, 0)


def test_decrease_after_24h_is_a_negative_event_when_allowed():
    steps, _ = plan(request(1_000, [event(1_500, timedelta(days=2))], negative_values_allowed=True))
    assert [(s.kind, s.micros, s.units) for s in steps] == [("meter_event", -500, -500)]


def test_meter_units_carry_their_remainder():
    steps, carry = plan(request(2_500, [], unit_micros=1_000))
    assert steps[0].units == 2 and carry == Carry(500, 0)
    steps, carry = plan(request(1_600, [], unit_micros=1_000, carry=carry))
    assert steps[0].units == 2 and carry == Carry(100, 0)


def test_timestamp_is_clamped_to_stripes_35_day_window():
    steps, _ = plan(request(10, [], event_time=NOW - timedelta(days=40)))
    assert NOW.timestamp() - steps[0].timestamp < 35 * 86400


def test_a_closed_period_includes_its_start_and_excludes_its_end():
    period = [(NOW - timedelta(days=30), NOW)]
    assert within_any(period, NOW - timedelta(days=30))
    assert not within_any(period, NOW)
    assert not within_any([], NOW)


@settings(max_examples=300, deadline=None)
@given(
    targets=st.lists(st.integers(0, 5_000_000), min_size=1, max_size=6),
    ages=st.lists(st.integers(0, 72), min_size=6, max_size=6),
    unit=st.sampled_from([1, 1_000, 10_000]),
    negative=st.booleans(),
)
def test_stripe_ends_at_the_target_exactly_whatever_the_history(targets, ages, unit, negative):
    """After each version's plan, the signed micros Stripe bills equal the ledger's billed
    amount, and Σ units × unit + carry equals the micros sent as meter events."""
    sent: list[Sent] = []
    carry = Carry()
    for version, (target, age) in enumerate(zip(targets, ages, strict=False), start=1):
        now = NOW + timedelta(hours=sum(ages[:version]))
        steps, carry = plan(
            PlanInput(
                run_id=1,
                version=version,
                target_micros=target,
                sent=sent,
                now=now,
                carry=carry,
                event_time=END,
                unit_micros=unit,
                negative_values_allowed=negative,
            )
        )
        sent += [delivered(s, now - timedelta(hours=age)) for s in steps]
        assert sent_total(sent) == target
    meter_micros = sum(s.micros for s in sent if s.kind in ("meter_event", "meter_cancel"))
    live_units = sum(s.units for s in live_events(sent))
    assert live_units * unit + carry.meter_micros == meter_micros
    credited = [s for s in sent if s.kind == "credit_note"]
    assert sum(s.units for s in credited) * unit + carry.credit_micros == -sum(
        s.micros for s in credited
    )
