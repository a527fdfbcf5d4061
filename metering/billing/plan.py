"""Pure: which Stripe calls bring what Stripe invoices for a run to its ledger billed amount.

What Stripe has for a run is the list of deliveries that took effect (meter events,
cancellations, rejections Stripe reported later, credit notes, and the balance credits of
older versions). A period is *open* until its invoice is finalized: Stripe finalizes an
invoice after the finalization grace period and then "updates it to reflect the latest
quantity for its billing period"; later usage or cancellations dated in that period never
change it ("Configure an invoice finalization grace period"). So the plan for a decision
version with billed amount ``T``:

* a run's meter events that are still cancellable (Stripe received them < 24 h ago, "Meter
  event adjustments") **and** dated in an open period are *movable*: they are cancelled and
  one meter event carries what the run should have there (cancel-and-resend);
* otherwise an increase is an extra meter event for the difference, dated in an open period
  (the run's own time when its period is still open, else now) — never in a finalized one,
  and never older than Stripe's 35 days;
* a decrease that movable events cannot absorb is a negative meter event (when the meter
  allows negative values and the period is open) or else a **credit note** on the invoice of
  the period where the run's money sits ("Create a credit note": the documented way to
  adjust a finalized invoice), by quantity of that invoice's metered line, so Stripe prices
  it in the invoice's own currency. No customer balance credits any more.

Meter values and credited quantities are whole units of ``unit_micros``; the remainders are
carried per customer and period (``carry``), so Σ units × unit + carry = Σ micros, exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

MICROS_PER_CENT = 10_000
MAX_METER_AGE = timedelta(days=35) - timedelta(hours=1)


@dataclass(frozen=True, slots=True)
class Sent:
    """A delivery that took effect, as the planner needs it."""

    kind: str  # "meter_event" | "meter_cancel" | "meter_rejected" | "credit_note" | ...
    identifier: str
    micros: int
    units: int
    received_at: datetime
    cancels_identifier: str | None = None
    event_timestamp: datetime | None = None  # meter events: the date Stripe bills them at


@dataclass(frozen=True, slots=True)
class Step:
    kind: str  # "meter_event" | "meter_cancel" | "credit_note" (| "balance_credit", legacy)
    identifier: str
    micros: int  # signed effect on what Stripe bills
    units: int = 0  # meter value, the cancelled event's units, or the quantity credited
    cents: int = 0  # legacy balance credits
    cancels_identifier: str | None = None
    # Meter events: unix seconds, fixed at planning so retries match. Credit notes: a moment
    # inside the period whose invoice is credited.
    timestamp: int = 0

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "identifier": self.identifier,
            "micros": self.micros,
            "units": self.units,
            "cents": self.cents,
            "cancels_identifier": self.cancels_identifier,
            "timestamp": self.timestamp,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Step:
        return cls(**data)


@dataclass(frozen=True, slots=True)
class Carry:
    meter_micros: int = 0
    credit_micros: int = 0


def month_end(moment: datetime) -> datetime:
    """The end of ``moment``'s UTC calendar month (Fairmeter bills calendar months)."""
    moment = moment.astimezone(UTC)
    year, month = (moment.year + 1, 1) if moment.month == 12 else (moment.year, moment.month + 1)
    return datetime(year, month, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class BillingPeriods:
    """What a customer's invoices say about which periods are still open.

    ``finalized``: periods whose invoice Stripe finalized (``invoice.finalized``).
    ``drafts``: periods with a draft invoice and the time Stripe will finalize it
    (``invoice.created``'s ``automatically_finalizes_at``). Any other period is a UTC month
    whose invoice finalizes ``grace`` after it ends. A period counts as closed ``margin``
    before it finalizes, so a call in flight cannot land on the wrong side.
    """

    finalized: tuple[tuple[datetime, datetime], ...] = ()
    drafts: tuple[tuple[datetime, datetime, datetime], ...] = ()
    grace: timedelta = timedelta(hours=1)
    margin: timedelta = timedelta(minutes=10)

    def closed(self, moment: datetime, now: datetime) -> bool:
        """Whether usage dated ``moment`` can no longer change its invoice at ``now``."""
        if within_any(self.finalized, moment):
            return True
        for start, end, finalizes_at in self.drafts:
            if start <= moment < end:
                return now >= finalizes_at - self.margin
        return now >= month_end(moment) + self.grace - self.margin


@dataclass(frozen=True, slots=True)
class PlanInput:
    run_id: int
    version: int
    target_micros: int
    sent: Sequence[Sent]
    now: datetime
    carry: Carry
    event_time: datetime
    unit_micros: int = 1
    cancel_window: timedelta = timedelta(hours=24)
    negative_values_allowed: bool = False
    periods: BillingPeriods = field(default_factory=BillingPeriods)


def meter_timestamp(event_time: datetime, now: datetime, periods: BillingPeriods) -> int:
    """The run's end when Stripe still bills it in an open period; otherwise now.

    Stripe takes timestamps "within the past 35 calendar days" only; clamping an old one to
    the edge of that window could land it in a finalized period, so it is dated now instead.
    """
    if event_time < now - MAX_METER_AGE or periods.closed(event_time, now):
        return int(now.timestamp())
    return int(min(event_time, now).timestamp())


def within_any(periods: Sequence[tuple[datetime, datetime]], moment: datetime) -> bool:
    """Whether ``moment`` lies in one of the half-open periods ``[start, end)``."""
    return any(start <= moment < end for start, end in periods)


def identifier_for(run_id: int, version: int) -> str:
    """DESIGN §5: ``run:<run>:v<version>`` (well under Stripe's 100 characters)."""
    return f"run:{run_id}:v{version}"


def sent_identifier(identifier: str, generation: int) -> str:
    """The identifier a step is sent under: a row resent after reconciling (its old key and
    identifier may be spent, or Stripe rejected them) uses a fresh one per generation."""
    return identifier if generation == 0 else f"{identifier}:g{generation}"


def live_events(sent: Sequence[Sent]) -> list[Sent]:
    """Meter events neither cancelled nor rejected by Stripe."""
    gone = {s.cancels_identifier for s in sent if s.kind in ("meter_cancel", "meter_rejected")}
    return [s for s in sent if s.kind == "meter_event" and s.identifier not in gone]


def sent_total(sent: Sequence[Sent]) -> int:
    """Signed micros Stripe will bill for the run after these deliveries."""
    return sum(s.micros for s in sent)


def plan(request: PlanInput) -> tuple[list[Step], Carry]:
    """The calls to make (in order) and the carry after them."""
    total = sent_total(request.sent)
    gap = request.target_micros - total
    if gap == 0:
        return [], request.carry
    identifier = identifier_for(request.run_id, request.version)
    now, periods = request.now, request.periods
    live = live_events(request.sent)
    movable = [
        e
        for e in live
        if now - e.received_at < request.cancel_window
        and not periods.closed(_dated(e, request), now)
    ]
    resend = request.target_micros - (total - sum(e.micros for e in movable))
    stamp = meter_timestamp(request.event_time, now, periods)
    if movable and resend >= 0:
        return _cancel_and_resend(request, movable, identifier, resend, stamp)
    if gap > 0:
        return _meter_event(request.carry, identifier, gap, request.unit_micros, stamp)
    steps, carry = _cancel_and_resend(request, movable, identifier, 0, stamp)
    decrease = -resend if movable else -gap
    if request.negative_values_allowed and not periods.closed(request.event_time, now):
        more, carry = _meter_event(carry, identifier, -decrease, request.unit_micros, stamp)
    else:
        fixed = [e for e in live if e not in movable]
        where = max((_dated(e, request) for e in fixed), default=request.event_time)
        more, carry = _credit_note(carry, identifier, decrease, request.unit_micros, where)
    return steps + more, carry


def _dated(event: Sent, request: PlanInput) -> datetime:
    return event.event_timestamp or request.event_time


def _meter_event(
    carry: Carry, identifier: str, micros: int, unit: int, stamp: int
) -> tuple[list[Step], Carry]:
    units, rest = divmod(carry.meter_micros + micros, unit)
    step = Step("meter_event", identifier, micros, units=units, timestamp=stamp)
    return [step], Carry(rest, carry.credit_micros)


def _cancel_and_resend(
    request: PlanInput, movable: list[Sent], identifier: str, resend: int, stamp: int
) -> tuple[list[Step], Carry]:
    steps = []
    carry = request.carry.meter_micros
    for event in movable:
        steps.append(
            Step(
                "meter_cancel",
                f"cancel:{event.identifier}",
                -event.micros,
                units=event.units,
                cancels_identifier=event.identifier,
            )
        )
        carry += event.units * request.unit_micros - event.micros
    if resend > 0:
        units, carry = divmod(carry + resend, request.unit_micros)
        steps.append(Step("meter_event", identifier, resend, units=units, timestamp=stamp))
    return steps, Carry(carry, request.carry.credit_micros)


def _credit_note(
    carry: Carry, identifier: str, micros: int, unit: int, where: datetime
) -> tuple[list[Step], Carry]:
    units, rest = divmod(carry.credit_micros + micros, unit)
    step = Step(
        "credit_note",
        f"credit_note:{identifier}",
        -micros,
        units=units,
        timestamp=int(where.timestamp()),
    )
    return [step], Carry(carry.meter_micros, rest)


def carry_effect(steps: Sequence[Step], unit: int) -> Carry:
    """How much planning ``steps`` moved the carries: undone when a plan is dropped unsent."""
    meter = credit = 0
    for step in steps:
        if step.kind == "meter_event":
            meter += step.micros - step.units * unit
        elif step.kind == "meter_cancel":
            meter += step.micros + step.units * unit
        elif step.kind == "credit_note":
            credit += -step.micros - step.units * unit
        elif step.kind == "balance_credit":
            credit += -step.micros - step.cents * MICROS_PER_CENT
    return Carry(meter, credit)
