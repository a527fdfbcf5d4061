"""Issue #29 §4, pure: rounding has one owner. Per customer and period Stripe bills
⌊ledger micros / unit⌋ units, and an invoice line net of our credit notes is that quantity
priced and rounded once, whatever the number, size and order of the corrections."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from metering.billing.credit_notes import payment_split
from metering.billing.gateway import InvoiceView
from metering.billing.plan import BillingPeriods, PlanInput, Sent, period_label, plan, step_moment
from metering.billing.rounding import credit_note_minor, line_minor, to_units

MICRO_PRICE = Decimal("0.0001")  # one micro-USD unit priced in cents (unit_micros = 1)


def credit_all(line_quantity: int, price: Decimal, credits: list[int]) -> tuple[list[int], int]:
    """The amounts of the notes crediting ``credits`` units in turn (0: not sent), and the
    units credited, as the credit-note sender applies ``credit_note_minor``."""
    line_amount = line_minor(line_quantity, price)
    units = minor = 0
    amounts = []
    for credit in credits:
        amount = credit_note_minor(
            line_quantity=line_quantity,
            line_amount_minor=line_amount,
            unit_amount_minor=price,
            credited_units_before=units,
            credited_minor_before=minor,
            units=credit,
        )
        amounts.append(max(amount, 0))
        units += credit
        minor += max(amount, 0)
    return amounts, units


def test_a_thousand_sub_cent_credits_credit_what_they_add_up_to():
    """1,000 credits of 0.4999 ¢ on a 10.00 USD line: each alone rounds to 0 ¢ (a refused,
    dead-lettered note before); together they credit 5.00 USD, leaving ⌊500.1 ¢⌋."""
    amounts, _ = credit_all(10_000_000, MICRO_PRICE, [4_999] * 1_000)
    assert sum(amounts) == 500
    assert line_minor(10_000_000, MICRO_PRICE) - sum(amounts) == 500
    assert min(amounts) == 0 and max(amounts) == 1  # zeros are never sent


def test_a_thousand_half_cent_credits_credit_five_dollars_not_ten():
    amounts, _ = credit_all(10_000_000, MICRO_PRICE, [5_000] * 1_000)
    assert sum(amounts) == 500


def test_a_eur_line_with_a_non_round_partial_credit_nets_to_the_line_rounded_once():
    price = Decimal("0.92")  # euro cents per meter unit
    amounts, _ = credit_all(388, price, [17, 23, 1])
    assert line_minor(388, price) - sum(amounts) == line_minor(388 - 41, price) == 319


@settings(max_examples=300, deadline=None)
@given(
    quantity=st.integers(0, 10**7),
    price=st.sampled_from([MICRO_PRICE, Decimal(1), Decimal("0.92"), Decimal("0.0137")]),
    fractions=st.lists(st.integers(1, 1_000), max_size=30),
)
def test_line_net_of_our_notes_is_the_remaining_quantity_rounded_once(quantity, price, fractions):
    credits = [quantity * f // 30_000 for f in fractions]
    credits = [c for c in credits if c > 0]
    amounts, credited = credit_all(quantity, price, credits)
    if credited <= quantity:
        assert line_minor(quantity, price) - sum(amounts) == line_minor(quantity - credited, price)


@settings(max_examples=300, deadline=None)
@given(
    unit=st.sampled_from([1, 7, 10_000]),
    moves=st.lists(st.integers(-50_000, 80_000), max_size=40),
)
def test_one_carry_bills_the_floor_of_the_periods_micros(unit, moves):
    """Bills and credits of one customer's period, in any order: the units Stripe has are
    ⌊Σ micros / unit⌋ after every step (a carry per kind billed 3 for 3.4 − 0.5)."""
    carry = units = total = 0
    for micros in moves:
        if total + micros < 0:
            continue  # the ledger never bills below zero
        step, carry = to_units(carry, micros, unit)
        units, total = units + step, total + micros
        assert units == total // unit and 0 <= carry < unit


def test_a_refund_of_a_balance_paid_invoice_refunds_the_charge_and_credits_the_balance():
    """120 billed, 30 paid from the customer's credit balance and 90 by card: a full credit
    refunds 90 and gives 30 back to the balance (a 120 refund was refused before)."""
    invoice = InvoiceView("in_1", "paid", "usd", 0, "il_1", Decimal(1), 120, 120, amount_paid=90)
    assert payment_split(120, invoice, 0, "refund") == (90, 30)
    assert payment_split(120, invoice, 80, "refund") == (10, 110)  # 80 refunded before
    assert payment_split(50, invoice, 0, "credit") == (0, 50)
    open_invoice = InvoiceView("in_2", "open", "usd", 70, "il_2", Decimal(1), 120, 120, 50)
    assert payment_split(100, open_invoice, 0, "refund") == (30, 0)  # 70 off what is owed


DEC = datetime(2026, 12, 10, tzinfo=UTC)
JAN = datetime(2027, 1, 5, tzinfo=UTC)
NOW = datetime(2027, 1, 20, tzinfo=UTC)


def test_a_decrease_spanning_two_invoices_is_credited_on_each():
    """120 units billed on December's invoice, 30 more on January's: a full refund is a
    120-unit note on December and a 30-unit note on January, not 150 on one."""
    december = (datetime(2026, 12, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC))
    sent = [
        Sent("meter_event", "run:7:v1", 1_200_000, 120, DEC, None, DEC),
        Sent("meter_event", "run:7:v2", 300_000, 30, NOW - timedelta(days=10), None, JAN),
    ]
    steps, carries = plan(
        PlanInput(
            run_id=7,
            version=3,
            target_micros=0,
            sent=sent,
            now=NOW,
            carries={},
            event_time=DEC,
            unit_micros=10_000,
            periods=BillingPeriods(finalized=(december,)),
        )
    )
    assert [(s.kind, s.units, s.micros, s.identifier) for s in steps] == [
        ("credit_note", 30, -300_000, "credit_note:run:7:v3:2027-01"),
        ("credit_note", 120, -1_200_000, "credit_note:run:7:v3:2026-12"),
    ]
    assert [datetime.fromtimestamp(s.timestamp, UTC) for s in steps] == [JAN, DEC]
    assert carries == {"2027-01": 0, "2026-12": 0}


@settings(max_examples=300, deadline=None)
@given(
    unit=st.sampled_from([7, 1_000, 10_000]),
    history=st.lists(
        # Targets in fifths of a unit pile up remainders; most corrections come within 24 h.
        st.tuples(st.integers(0, 2), st.integers(0, 12), st.sampled_from([0, 0, 1, 30])),
        min_size=1,
        max_size=12,
    ),
)
def test_runs_sharing_a_period_bill_the_floor_of_its_micros_after_every_correction(unit, history):
    """Three runs of one customer in one open period, corrected in any order and at any age
    (fresh events are cancelled and resent, older ones credited): after every plan each
    period's carry is in [0, unit), so Stripe holds ⌊Σ micros / unit⌋ units there once its
    notes are issued — a cancel alone used to leave one unit too many or too few."""
    start = datetime(2026, 11, 3, tzinfo=UTC)
    now = start
    carries: dict[str, int] = {}
    sent: dict[int, list[Sent]] = {0: [], 1: [], 2: []}
    versions = {0: 0, 1: 0, 2: 0}
    steps_seen = []
    for run, fifths, hours in history:
        target = fifths * 3 * unit // 5
        now += timedelta(hours=hours)
        versions[run] += 1
        steps, carries = plan(
            PlanInput(
                run_id=run,
                version=versions[run],
                target_micros=target,
                sent=sent[run],
                now=now,
                carries=carries,
                event_time=start + timedelta(minutes=run),
                unit_micros=unit,
                periods=BillingPeriods(),
            )
        )
        for step in steps:
            moment = datetime.fromtimestamp(step.timestamp, UTC)
            sent[run].append(
                Sent(
                    step.kind,
                    step.identifier,
                    step.micros,
                    step.units,
                    now,
                    step.cancels_identifier,
                    moment,
                )
            )
        steps_seen += steps
        assert all(0 <= micros < unit for micros in carries.values())
    for label, carry in carries.items():
        here = [s for s in steps_seen if period_label(step_moment(s)) == label]
        units = sum(s.units if s.kind == "meter_event" else -s.units for s in here)
        assert (
            units == sum(s.micros for s in here) // unit
            and carry == sum(s.micros for s in here) % unit
        )
