"""R8: the protection cap on automatic credits per customer and billing period."""

from __future__ import annotations

from enum import StrEnum

import msgspec

from metering.policy.facts import PPM, CustomerPeriod, PolicyConfig


class CapKind(StrEnum):
    AMOUNT = "amount"
    RUNS = "runs"


class CapBreach(msgspec.Struct, frozen=True):
    kind: CapKind
    credit_micros: int  # what this run would have credited automatically
    total_micros: int  # the period's automatic credits including it
    limit_micros: int  # max(cap fraction × period gross, cap floor), rounded down to display
    refunded_runs: int  # the period's automatically refunded runs including this one
    limit_runs: int


def cap_breach(
    period: CustomerPeriod, config: PolicyConfig, *, credit_micros: int, full_refund: bool
) -> CapBreach | None:
    """The breach if this automatic credit would take the period above the cap, else None.

    "Above" is strict. The fraction is compared exactly (cross-multiplied, no rounding):
    a total equal to the limit is still within it.
    """
    if credit_micros <= 0:
        return None
    total = period.auto_credited_micros + credit_micros
    over_fraction = total * PPM > period.period_gross_micros * config.cap_fraction_ppm
    over_amount = over_fraction and total > config.cap_floor_micros
    refunded = period.auto_refunded_runs + (1 if full_refund else 0)
    over_runs = full_refund and refunded > config.cap_runs
    if not (over_amount or over_runs):
        return None
    limit = max(
        period.period_gross_micros * config.cap_fraction_ppm // PPM, config.cap_floor_micros
    )
    return CapBreach(
        kind=CapKind.AMOUNT if over_amount else CapKind.RUNS,
        credit_micros=credit_micros,
        total_micros=total,
        limit_micros=limit,
        refunded_runs=refunded,
        limit_runs=config.cap_runs,
    )
