"""Pure: which Stripe calls bring what Stripe bills for a run to its ledger billed amount.

What Stripe has for a run is the list of deliveries that took effect (meter events,
cancellations, balance credits). The plan for a decision version with billed amount ``T``:

* nothing sent yet → one meter event of ``T``;
* every live meter event still cancellable (Stripe received it < 24 h ago) → cancel them all
  and send one meter event of ``T`` plus what balance credits already gave back;
* otherwise an increase → an extra meter event for the difference; a decrease → a customer
  balance credit (whole cents, the sub-cent rest carried per customer), or, when negative
  meter values are enabled and the period's invoice is still open, a negative meter event.

Meter values are whole units of ``unit_micros``; the remainder is carried per customer and
period (``carry``), so Σ units × unit + carry = Σ micros sent, exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

MICROS_PER_CENT = 10_000


@dataclass(frozen=True, slots=True)
class Sent:
    """A delivery that took effect, as the planner needs it."""

    kind: str  # "meter_event" | "meter_cancel" | "balance_credit"
    identifier: str
    micros: int
    units: int
    received_at: datetime
    cancels_identifier: str | None = None


@dataclass(frozen=True, slots=True)
class Step:
    kind: str  # "meter_event" | "meter_cancel" | "balance_credit"
    identifier: str
    micros: int  # signed effect on what Stripe bills
    units: int = 0  # meter value (meter events) or the cancelled event's units
    cents: int = 0  # balance credits
    cancels_identifier: str | None = None
    timestamp: int = 0  # meter events: unix seconds, fixed at planning so retries match

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


MAX_METER_AGE = timedelta(days=35) - timedelta(hours=1)


def meter_timestamp(event_time: datetime, now: datetime) -> int:
    """The run's end, within what Stripe accepts (at most 35 days old, not in the future)."""
    return int(min(max(event_time, now - MAX_METER_AGE), now).timestamp())


def within_any(periods: Sequence[tuple[datetime, datetime]], moment: datetime) -> bool:
    """Whether ``moment`` lies in one of the half-open periods ``[start, end)``."""
    return any(start <= moment < end for start, end in periods)


def identifier_for(run_id: int, version: int) -> str:
    """DESIGN §5: ``run:<run>:v<version>`` (well under Stripe's 100 characters)."""
    return f"run:{run_id}:v{version}"


def live_events(sent: Sequence[Sent]) -> list[Sent]:
    cancelled = {s.cancels_identifier for s in sent if s.kind == "meter_cancel"}
    return [s for s in sent if s.kind == "meter_event" and s.identifier not in cancelled]


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
    live = live_events(request.sent)
    fresh = all(request.now - e.received_at < request.cancel_window for e in live)
    if live and fresh:
        return _cancel_and_resend(request, live, identifier)
    stamp = meter_timestamp(request.event_time, request.now)
    if gap > 0 or request.negative_values_allowed:
        return _meter_event(request.carry, identifier, gap, request.unit_micros, stamp)
    return _balance_credit(request.carry, identifier, -gap)


def _meter_event(
    carry: Carry, identifier: str, micros: int, unit: int, stamp: int
) -> tuple[list[Step], Carry]:
    units, rest = divmod(carry.meter_micros + micros, unit)
    step = Step("meter_event", identifier, micros, units=units, timestamp=stamp)
    return [step], Carry(rest, carry.credit_micros)


def _cancel_and_resend(
    request: PlanInput, live: list[Sent], identifier: str
) -> tuple[list[Step], Carry]:
    steps = []
    carry = request.carry.meter_micros
    for event in live:
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
    # Balance credits cannot be cancelled: the new event also covers what they gave back.
    credits = sum(s.micros for s in request.sent if s.kind == "balance_credit")
    resend = request.target_micros - credits
    if resend > 0:
        units, carry = divmod(carry + resend, request.unit_micros)
        stamp = meter_timestamp(request.event_time, request.now)
        steps.append(Step("meter_event", identifier, resend, units=units, timestamp=stamp))
    return steps, Carry(carry, request.carry.credit_micros)


def _balance_credit(carry: Carry, identifier: str, micros: int) -> tuple[list[Step], Carry]:
    cents, rest = divmod(carry.credit_micros + micros, MICROS_PER_CENT)
    step = Step("balance_credit", f"credit:{identifier}", -micros, cents=cents)
    return [step], Carry(carry.meter_micros, rest)
