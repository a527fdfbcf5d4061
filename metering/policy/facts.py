"""What the settlement policy takes and gives: frozen structs (msgspec: built in C, a run's
facts are millions of them in a replay), integers for money."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final

import msgspec

CONFIRMED: Final = "confirmed"
PARTIALLY_CREDITED: Final = "partially_credited"
REFUNDED: Final = "refunded"
HELD_FOR_REVIEW: Final = "held_for_review"
OUTCOMES: Final = (CONFIRMED, PARTIALLY_CREDITED, REFUNDED, HELD_FOR_REVIEW)

PPM: Final = 1_000_000


class EventFact(msgspec.Struct, frozen=True, array_like=True):
    """What status and policy need of one stored event. (``array_like``: kept on decisions
    as MessagePack arrays, ``metering/settlement/decided_facts.py``.)"""

    event_id: str
    type: str
    time: datetime
    data: dict[str, Any]


class UsageLine(msgspec.Struct, frozen=True, array_like=True):
    """One priced ``run.usage`` event (a ledger hold). (``array_like`` as ``EventFact``.)"""

    line_id: int
    event_id: str
    step: int
    attempt: int
    tool_call_id: str | None
    replay: bool
    gross_micros: int
    time: datetime

    def __post_init__(self) -> None:
        if self.gross_micros < 0:
            raise ValueError(f"usage line {self.line_id} has negative gross_micros")
        if self.attempt < 1 or self.step < 0:
            raise ValueError(f"usage line {self.line_id} has an impossible step or attempt")


class CustomerPeriod(msgspec.Struct, frozen=True):
    """The customer's billing period so far, for the protection cap (R8).

    ``auto_credited_micros`` and ``auto_refunded_runs`` count only OTHER runs' decisions in
    force that were applied automatically (outcome ``partially_credited`` or ``refunded``);
    held decisions are provisional and must not be counted.
    """

    period_gross_micros: int = 0  # including this run
    auto_credited_micros: int = 0
    auto_refunded_runs: int = 0

    def __post_init__(self) -> None:
        if min(self.period_gross_micros, self.auto_credited_micros, self.auto_refunded_runs) < 0:
            raise ValueError("customer period figures cannot be negative")


class RunFacts(msgspec.Struct, frozen=True):
    """Everything the policy knows about one run.

    ``events`` and ``usage`` may come in any order and with duplicates (by ``event_id`` and
    ``line_id``). ``abandoned`` is True when the run is settled without a terminal event
    (idle timeout, or forced settlement after an unresumed drop).
    """

    events: tuple[EventFact, ...] = ()
    usage: tuple[UsageLine, ...] = ()
    abandoned: bool = False
    period: CustomerPeriod = msgspec.field(default_factory=CustomerPeriod)


class PolicyConfig(msgspec.Struct, frozen=True):
    """What ``decide`` needs of a tenant's policy document (``metering.policy.document``).

    A switched-off rule (``r1``–``r5``, ``r8``) names no line, credits nothing and is not
    cited as evidence. ``r7_auto_refund_under_micros`` is None when R7 holds every
    unverified failure for review; an amount N refunds such a run whose gross is below N
    automatically instead (still under the R8 cap).
    """

    cap_fraction_ppm: int = 250_000  # 25 % of the period's gross
    cap_floor_micros: int = 5_000_000  # but never below 5 USD
    cap_runs: int = 20  # automatically refunded runs per period
    r1: bool = True  # duplicate tool calls
    r2: bool = True  # replayed context
    r3: bool = True  # lost work
    r4: bool = True  # refund of an interrupted run with nothing delivered
    r5: bool = True  # partial credit of an interrupted run past its last delivery
    r7_auto_refund_under_micros: int | None = None
    r8: bool = True  # the protection cap


BUILT_IN_POLICY: Final = PolicyConfig()


class Decision(msgspec.Struct, frozen=True):
    """The settlement of one run. ``billed_micros + credited_micros == gross_micros``.

    For ``held_for_review`` the amounts are provisional: ``credited_micros`` is only what
    R1–R3 credit whatever the outcome (duplicate or lost work), ``billed_micros`` the rest,
    and nothing is billed until support resolves the run.
    """

    outcome: str
    gross_micros: int
    billed_micros: int
    credited_micros: int
    credited_line_ids: tuple[int, ...]
    rule_ids: tuple[str, ...]
    evidence_event_ids: tuple[str, ...]
    explanation: str
    status: str
    # The explanation without its closing sentence on the amounts: support's actions
    # re-close it (``explain.after_support``) rather than append to a contradiction.
    story: str = ""

    def __post_init__(self) -> None:
        # A broken money invariant must crash here, never reach the ledger.
        if self.outcome not in OUTCOMES:
            raise ValueError(f"unknown outcome {self.outcome!r}")
        if min(self.billed_micros, self.credited_micros) < 0:
            raise ValueError("billed and credited amounts cannot be negative")
        if self.billed_micros + self.credited_micros != self.gross_micros:
            raise ValueError("billed + credited must equal gross")
