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

Meter values and credited quantities are whole units of ``unit_micros``. Rounding has one
owner (``metering/billing/rounding.py``): every step, a meter event or a cancel or a credit
note, turns micros into units through ONE carry per customer and period the step lands in
(``Carries``, keyed by the UTC month of the step's date), so per customer and period
Σ units × unit + carry = Σ micros exactly and Stripe bills ⌊Σ micros / unit⌋ units. A
decrease is credited on the invoice of each period where the run's money sits, newest first,
never more there than the run still has on that invoice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from metering.billing.rounding import to_units

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


Carries = Mapping[str, int]  # period label ("YYYY-MM") → micros not yet sent as a whole unit


def period_label(moment: datetime) -> str:
    """The carry's key for a step dated ``moment``: its UTC month."""
    return moment.astimezone(UTC).strftime("%Y-%m")


def step_moment(step: Step) -> datetime:
    """The date a step lands on: a meter event's timestamp, a cancelled event's, a credit
    note's invoice period."""
    return datetime.fromtimestamp(step.timestamp, UTC)


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

    def period_start(self, moment: datetime) -> datetime:
        """The start of the invoice period holding ``moment``: an invoice's own period when
        a webhook told us one, else the UTC month (which invoice a credit note goes on)."""
        for start, end in self.finalized:
            if start <= moment < end:
                return start
        for start, end, _ in self.drafts:
            if start <= moment < end:
                return start
        return moment.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)


@dataclass(frozen=True, slots=True)
class PlanInput:
    run_id: int
    version: int
    target_micros: int
    sent: Sequence[Sent]
    now: datetime
    carries: Carries
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
    """docs/stripe.md: ``run:<run>:v<version>`` (well under Stripe's 100 characters)."""
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


def plan(request: PlanInput) -> tuple[list[Step], dict[str, int]]:
    """The calls to make (in order) and the carries after them (every period's, touched or
    not)."""
    carries = dict(request.carries)
    total = sent_total(request.sent)
    gap = request.target_micros - total
    if gap == 0:
        return [], carries
    identifier = identifier_for(request.run_id, request.version)
    now, periods, unit = request.now, request.periods, request.unit_micros
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
        steps = _cancel_and_resend(request, carries, movable, identifier, resend, stamp)
        return steps + _settle_rounding(carries, identifier, steps, unit), carries
    if gap > 0:
        return [_meter_event(carries, identifier, gap, unit, stamp)], carries
    steps = _cancel_and_resend(request, carries, movable, identifier, 0, stamp)
    decrease = -resend if movable else -gap
    if request.negative_values_allowed and not periods.closed(request.event_time, now):
        steps.append(_meter_event(carries, identifier, -decrease, unit, stamp))
    else:
        fixed = [e for e in live if e not in movable]
        steps += _credit_notes(request, carries, identifier, decrease, fixed)
    return steps + _settle_rounding(carries, identifier, steps, unit), carries


def _dated(event: Sent, request: PlanInput) -> datetime:
    return event.event_timestamp or request.event_time


def _units(carries: dict[str, int], moment: datetime, micros: int, unit: int) -> int:
    """Whole units for ``micros`` landing on ``moment``'s period, through its carry."""
    label = period_label(moment)
    units, carries[label] = to_units(carries.get(label, 0), micros, unit)
    return units


def _meter_event(
    carries: dict[str, int], identifier: str, micros: int, unit: int, stamp: int
) -> Step:
    units = _units(carries, datetime.fromtimestamp(stamp, UTC), micros, unit)
    return Step("meter_event", identifier, micros, units=units, timestamp=stamp)


def _cancel_and_resend(
    request: PlanInput,
    carries: dict[str, int],
    movable: list[Sent],
    identifier: str,
    resend: int,
    stamp: int,
) -> list[Step]:
    """Cancel ``movable`` (each takes back exactly its units, the difference to its micros
    staying in its period's carry) and send ``resend`` as one event."""
    steps = []
    for event in movable:
        moment = _dated(event, request)
        label = period_label(moment)
        carries[label] = carries.get(label, 0) + event.units * request.unit_micros - event.micros
        steps.append(
            Step(
                "meter_cancel",
                f"cancel:{event.identifier}",
                -event.micros,
                units=event.units,
                cancels_identifier=event.identifier,
                timestamp=int(moment.timestamp()),
            )
        )
    if resend > 0:
        steps.append(_meter_event(carries, identifier, resend, request.unit_micros, stamp))
    return steps


def _settle_rounding(
    carries: dict[str, int], identifier: str, steps: list[Step], unit: int
) -> list[Step]:
    """Bring back into ``[0, unit)`` the carry of each period a cancel left outside it.

    A cancel takes back exactly the event's units, so the rounding that event took stays in
    the carry; with other runs' events in the period meanwhile, Stripe can then hold one
    unit more or less than ⌊Σ micros / unit⌋. One unit too few is a 0-micro meter event of
    the missing units (the period is open: only open periods' events are cancelled); one too
    many is a 0-micro credit note of the extra units on that period's invoice, sent once it
    is final."""
    settled = []
    for step in steps:
        moment = step_moment(step)
        label = period_label(moment)
        if step.kind != "meter_cancel" or 0 <= carries.get(label, 0) < unit:
            continue
        units = _units(carries, moment, 0, unit)
        kind = "meter_event" if units > 0 else "credit_note"
        name = f"{identifier}:rounding:{label}"
        settled.append(
            Step(
                kind,
                name if units > 0 else f"credit_note:{name}",
                0,
                units=abs(units),
                timestamp=step.timestamp,
            )
        )
    return settled


def _credit_notes(
    request: PlanInput,
    carries: dict[str, int],
    identifier: str,
    decrease: int,
    fixed: list[Sent],
) -> list[Step]:
    """Credit notes for ``decrease`` micros, one per invoice where the run's money sits
    (its events Stripe will no longer move), newest invoice first and never more on an
    invoice than the run still has there: a run billed on December's and on January's
    invoice is credited on each, not all of it on one."""
    left, steps = decrease, []
    shares = _money_by_invoice(request, fixed)
    for n, (start, (moment, available)) in enumerate(shares):
        last = n == len(shares) - 1
        share = left if last else min(left, available)
        if share <= 0:
            continue
        left -= share
        credited = -_units(carries, moment, -share, request.unit_micros)
        steps.append(
            Step(
                "credit_note",
                f"credit_note:{identifier}:{period_label(start)}",
                -share,
                units=credited,
                timestamp=int(moment.timestamp()),
            )
        )
    return steps


def _money_by_invoice(
    request: PlanInput, fixed: list[Sent]
) -> list[tuple[datetime, tuple[datetime, int]]]:
    """Per invoice period (newest first): a moment inside it and the micros of the run
    Stripe bills there (fixed events less our earlier credit notes on that invoice). The
    run's own period comes last when it holds nothing, so a decrease always has a home."""
    periods = request.periods
    found: dict[datetime, tuple[datetime, int]] = {}
    for event in fixed:
        moment = _dated(event, request)
        start = periods.period_start(moment)
        latest, micros = found.get(start, (moment, 0))
        found[start] = (max(latest, moment), micros + event.micros)
    for note in request.sent:
        if note.kind == "credit_note" and note.event_timestamp is not None:
            start = periods.period_start(note.event_timestamp)
            if start in found:
                latest, micros = found[start]
                found[start] = (latest, micros + note.micros)
    if not found:
        found[periods.period_start(request.event_time)] = (request.event_time, 0)
    return sorted(found.items(), key=lambda kv: kv[0], reverse=True)


def carry_effect(steps: Sequence[Step], unit: int) -> dict[str, int]:
    """How much planning ``steps`` moved each period's carry: undone when a plan is dropped
    unsent. Legacy balance credits moved no carry that still exists."""
    effect: dict[str, int] = {}
    for step in steps:
        if step.kind == "meter_event":
            moved = step.micros - step.units * unit
        elif step.kind in ("meter_cancel", "credit_note"):  # units taken off, micros < 0
            moved = step.micros + step.units * unit
        else:
            continue
        label = period_label(step_moment(step))
        effect[label] = effect.get(label, 0) + moved
    return {label: micros for label, micros in effect.items() if micros}
