"""Settlement policy v1 (docs/policy.md): pure, RunFacts → Decision. No I/O, no database.

Modules: ``facts`` (inputs and outputs), ``timeline`` (canonical view of a run's facts),
``duplicates`` (R1–R3), ``ending`` (R0, R4–R7), ``cap`` (R8), ``explain`` (customer
sentence), ``decide`` (putting it together).
"""

from metering.policy.decide import decide, outcome_for, status_for
from metering.policy.facts import (
    CONFIRMED,
    HELD_FOR_REVIEW,
    OUTCOMES,
    PARTIALLY_CREDITED,
    REFUNDED,
    CustomerPeriod,
    Decision,
    EventFact,
    PolicyConfig,
    RunFacts,
    UsageLine,
)

__all__ = [
    "CONFIRMED",
    "HELD_FOR_REVIEW",
    "OUTCOMES",
    "PARTIALLY_CREDITED",
    "REFUNDED",
    "CustomerPeriod",
    "Decision",
    "EventFact",
    "PolicyConfig",
    "RunFacts",
    "UsageLine",
    "decide",
    "outcome_for",
    "status_for",
]
