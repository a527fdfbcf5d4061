"""Pure planning of Stripe calls: every path, and the money invariants under hypothesis."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from metering.billing.plan import (
    PlanInput,
    Sent,
    Step,
    period_label,
    plan,
    sent_total,
    step_moment,
    within_any,
)

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
END = NOW - timedelta(hours=1)


def request(target: int, sent: list[Sent], **kw) -> PlanInput:
    defaults = dict(
        run_id=7, version=2, target_micros=target, sent=sent, now=NOW, carries={}, event_time=END
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
    assert carry == {"2026-11": 0}


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


def test_decrease_after_24h_is_a_credit_note_rounded_through_the_periods_one_carry():
    steps, carry = plan(request(1_000, [event(1_500_000, timedelta(days=2))], unit_micros=10_000))
    # Stripe bills 150 units; the ledger's 1,000 micros are less than one: ⌊0.1⌋ = 0 units
    # are left, so all 150 are credited and the 1,000 micros stay in November's carry.
    # Never a customer balance credit (one per currency, applied to the next invoice).
    assert [(s.kind, s.units, s.micros) for s in steps] == [("credit_note", 150, -1_499_000)]
    assert steps[0].timestamp == int(END.timestamp())  # the invoice of the event's period
    assert carry == {"2026-11": 1_000}
    steps, carry = plan(
        request(0, [event(1_000, timedelta(days=2))], carries=carry, unit_micros=10_000)
    )
    assert steps[0].units == 0 and carry == {"2026-11": 0}


def test_decrease_after_24h_is_a_negative_event_when_allowed():
    steps, _ = plan(request(1_000, [event(1_500, timedelta(days=2))], negative_values_allowed=True))
    assert [(s.kind, s.micros, s.units) for s in steps] == [("meter_event", -500, -500)]


def test_meter_units_carry_their_remainder():
    steps, carry = plan(request(2_500, [], unit_micros=1_000))
    assert steps[0].units == 2 and carry == {"2026-11": 500}
    steps, carry = plan(request(1_600, [], unit_micros=1_000, carries=carry))
    assert steps[0].units == 2 and carry == {"2026-11": 100}


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
    carry: dict[str, int] = {}
    all_steps: list[Step] = []
    for version, (target, age) in enumerate(zip(targets, ages, strict=False), start=1):
        now = NOW + timedelta(hours=sum(ages[:version]))
        steps, carry = plan(
            PlanInput(
                run_id=1,
                version=version,
                target_micros=target,
                sent=sent,
                now=now,
                carries=carry,
                event_time=END,
                unit_micros=unit,
                negative_values_allowed=negative,
            )
        )
        sent += [delivered(s, now - timedelta(hours=age)) for s in steps]
        all_steps += steps
        assert all(0 <= micros < unit for micros in carry.values())  # ⌊Σ micros / unit⌋
        assert sent_total(sent) == target
    # Per period, Σ signed units × unit + carry = Σ micros: one carry for events, cancels and
    # credit notes together.
    for label in {period_label(datetime.fromtimestamp(s.timestamp, UTC)) for s in all_steps}:
        here = [s for s in all_steps if period_label(step_moment(s)) == label]
        signed = sum(s.units if s.kind == "meter_event" else -s.units for s in here)
        assert signed * unit + carry.get(label, 0) == sum(s.micros for s in here)
