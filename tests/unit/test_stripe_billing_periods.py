"""Issue #20, pure: nothing is cancelled, resent or dated into a finalized invoice period.

``now`` is early in March; February's invoice was finalized (Stripe's one-hour grace after
the month end is long past). Amounts are micros; one meter unit is 10,000 micros.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from metering.billing.plan import (
    BillingPeriods,
    PlanInput,
    Sent,
    carry_effect,
    plan,
)
from metering.billing.reconcile import Landed, verdict
from metering.billing.rejections import REPLAN_CODES, meter_identifier, sampled_errors

MARCH = datetime(2027, 3, 1, tzinfo=UTC)
NOW = MARCH + timedelta(days=2, hours=12)
FEB_RUN = datetime(2027, 2, 20, 9, tzinfo=UTC)
FEBRUARY = (datetime(2027, 2, 1, tzinfo=UTC), MARCH)
UNIT = 10_000


def request(target: int, sent: list[Sent], **kw) -> PlanInput:
    defaults = dict(
        run_id=7,
        version=2,
        target_micros=target,
        sent=sent,
        now=NOW,
        carries={},
        event_time=FEB_RUN,
        unit_micros=UNIT,
        periods=BillingPeriods(finalized=(FEBRUARY,)),
    )
    defaults.update(kw)
    return PlanInput(**defaults)


def feb_event(micros: int, received: datetime, identifier: str = "run:7:v1") -> Sent:
    return Sent("meter_event", identifier, micros, micros // UNIT, received, None, FEB_RUN)


def test_increase_after_the_invoice_is_finalized_is_dated_now_not_in_the_closed_month():
    steps, _ = plan(request(1_500_000, [feb_event(1_200_000, MARCH - timedelta(days=8))]))
    assert [(s.kind, s.micros, s.units) for s in steps] == [("meter_event", 300_000, 30)]
    assert steps[0].timestamp == int(NOW.timestamp())


def test_a_fresh_event_of_a_finalized_month_is_not_cancelled_but_credited_on_its_invoice():
    """Cancelling it would move the summaries, never the finalized invoice."""
    fresh = feb_event(1_200_000, NOW - timedelta(hours=2))
    steps, carry = plan(request(1_000_000, [fresh]))
    assert [(s.kind, s.micros, s.units) for s in steps] == [("credit_note", -200_000, 20)]
    assert steps[0].timestamp == int(FEB_RUN.timestamp())  # February's invoice
    assert carry == {"2027-02": 0}


def test_within_the_grace_period_the_previous_month_is_still_open():
    just_after = MARCH + timedelta(minutes=30)
    fresh = feb_event(1_200_000, just_after - timedelta(hours=1))
    steps, _ = plan(request(1_000_000, [fresh], now=just_after, periods=BillingPeriods()))
    assert [s.kind for s in steps] == ["meter_cancel", "meter_event"]
    assert steps[1].timestamp == int(FEB_RUN.timestamp())


def test_a_period_closes_a_margin_before_the_draft_invoice_finalizes():
    draft = (FEBRUARY[0], FEBRUARY[1], MARCH + timedelta(hours=3))  # a longer grace
    periods = BillingPeriods(drafts=(draft,), margin=timedelta(minutes=10))
    assert not periods.closed(FEB_RUN, MARCH + timedelta(hours=2, minutes=49))
    assert periods.closed(FEB_RUN, MARCH + timedelta(hours=2, minutes=50))
    assert BillingPeriods().closed(FEB_RUN, MARCH + timedelta(minutes=50))


def test_events_older_than_35_days_are_dated_now_never_into_a_finalized_month():
    old = datetime(2027, 1, 20, tzinfo=UTC)  # 41 days before NOW; Jan 27 is also final
    january = (datetime(2027, 1, 1, tzinfo=UTC), FEBRUARY[0])
    periods = BillingPeriods(finalized=(january, FEBRUARY))
    steps, _ = plan(request(100_000, [], event_time=old, periods=periods))
    assert steps[0].timestamp == int(NOW.timestamp())


def test_a_decrease_spanning_a_fresh_open_event_cancels_it_and_credits_the_rest():
    """The run's increase went to March (open, fresh); the rest of the decrease is a credit
    note on February's invoice, where the run's other money sits."""
    march_event = Sent("meter_event", "run:7:v2", 300_000, 30, NOW - timedelta(hours=1), None, NOW)
    sent = [feb_event(1_200_000, MARCH - timedelta(days=8)), march_event]
    steps, _ = plan(request(1_000_000, sent, version=3))
    assert [(s.kind, s.micros) for s in steps] == [
        ("meter_cancel", -300_000),
        ("credit_note", -200_000),
    ]
    assert steps[1].timestamp == int(FEB_RUN.timestamp())


def test_a_rejected_event_counts_as_nothing_sent():
    rejected = Sent("meter_rejected", "rejected:run:7:v1", -1_200_000, 120, NOW, "run:7:v1")
    steps, _ = plan(request(1_200_000, [feb_event(1_200_000, NOW - timedelta(hours=1)), rejected]))
    assert [(s.kind, s.micros) for s in steps] == [("meter_event", 1_200_000)]
    assert steps[0].timestamp == int(NOW.timestamp())  # February is final: dated now


@settings(max_examples=200, deadline=None)
@given(
    target=st.integers(0, 3_000_000),
    sent_micros=st.integers(1, 3_000_000),
    carry=st.tuples(st.integers(0, UNIT - 1), st.integers(0, UNIT - 1)),
    fresh=st.booleans(),
)
def test_dropping_an_unsent_plan_gives_back_exactly_the_carry_it_took(
    target, sent_micros, carry, fresh
):
    before = {"2027-02": carry[0], "2027-03": carry[1]}
    received = NOW - (timedelta(hours=1) if fresh else timedelta(days=3))
    steps, after = plan(request(target, [feb_event(sent_micros, received)], carries=before))
    effect = carry_effect(steps, UNIT)
    given_back = {p: after.get(p, 0) - effect.get(p, 0) for p in set(after) | set(before)}
    assert given_back == {p: before.get(p, 0) for p in given_back}


def test_a_call_landed_when_stripe_moved_by_its_units_and_not_when_stripe_did_not_move():
    assert verdict(120, 120) is Landed.YES
    assert verdict(-120, -120) is Landed.YES
    assert verdict(120, 0) is Landed.NO
    assert verdict(120, 60) is Landed.UNKNOWN


def test_error_report_samples_name_our_identifier_through_the_idempotency_key():
    report = {
        "data": {
            "reason": {
                "error_types": [
                    {
                        "code": "meter_event_customer_not_found",
                        "error_count": 9,
                        "sample_errors": [
                            {"request": {"identifier": "fairmeter:12:0:run:3:v1:g1"}},
                            {"request": {"identifier": "run:4:v1"}},
                        ],
                    }
                ]
            }
        }
    }
    assert sampled_errors(report) == [
        ("run:3:v1:g1", "meter_event_customer_not_found"),
        ("run:4:v1", "meter_event_customer_not_found"),
    ]
    assert meter_identifier("fairmeter:1:2:run:9:v2") == "run:9:v2"
    assert "timestamp_too_far_in_past" in REPLAN_CODES
