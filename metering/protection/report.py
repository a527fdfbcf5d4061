"""Pure: settled runs → the cost of protection per customer and in total.

Every amount is integer micro-USD. A run counts in the period of its decision in force.
A held run's amounts are provisional, so its whole gross is ``held`` and none of it billed
or credited: for every run, and so for every customer and the total,
``gross = billed + credited + held``, ``credited = Σ credited_by_rule`` and the provider cost
of the credited usage is ``Σ credited_cost_by_rule``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from metering.billing.rates import InvoiceFigures
from metering.money import round_half_even_div

RULES = ("R1", "R2", "R3", "R4", "R5")
SUPPORT = "support"
# Credited lines no rule names when re-derived (e.g. a rule that changed since): counted,
# never silently given to a rule.
UNATTRIBUTED = "other"
CREDIT_KINDS = (*RULES, SUPPORT, UNATTRIBUTED)
RULE_NAMES = {
    "R1": "duplicate tool calls",
    "R2": "replayed context",
    "R3": "lost work",
    "R4": "refunded failures",
    "R5": "partial deliveries",
    SUPPORT: "support credits",
    UNATTRIBUTED: "other credits",
}
TOP_CUSTOMERS = 10
NOTHING_BY_KIND = tuple((kind, 0) for kind in CREDIT_KINDS)
BY_KIND = ("credited_by_rule", "credited_cost_by_rule")


def _add_by_kind(
    mine: tuple[tuple[str, int], ...], theirs: tuple[tuple[str, int], ...]
) -> tuple[tuple[str, int], ...]:
    other = dict(theirs)
    return tuple((kind, amount + other[kind]) for kind, amount in mine)


@dataclass(frozen=True, slots=True)
class CostedLine:
    """One usage line: what the customer was charged and what the provider charged us.

    ``cost_micros`` is None when the cost catalog has no cost in force for its model then.
    """

    line_id: int
    gross_micros: int
    cost_micros: int | None


@dataclass(frozen=True, slots=True)
class SettledRun:
    """A run's decision in force, with its lines and the rule that credited each one.

    ``credited_by_line`` maps each line the policy credited to one of ``RULES`` (or
    ``UNATTRIBUTED``); whatever the decision credits beyond those lines is support's.
    """

    run_id: int
    customer_id: str
    held: bool
    gross_micros: int
    billed_micros: int
    credited_micros: int
    lines: tuple[CostedLine, ...]
    credited_by_line: Mapping[int, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Figures:
    """Additive figures of a set of runs (a customer, or the whole tenant)."""

    runs: int = 0
    gross_micros: int = 0
    billed_micros: int = 0
    credited_micros: int = 0
    held_micros: int = 0
    credited_by_rule: tuple[tuple[str, int], ...] = NOTHING_BY_KIND
    cost_micros: int = 0  # provider cost of all usage
    # provider cost of the usage each kind credited (what each rule cost the platform)
    credited_cost_by_rule: tuple[tuple[str, int], ...] = NOTHING_BY_KIND
    uncosted_lines: int = 0
    uncosted_gross_micros: int = 0

    @property
    def margin_before_micros(self) -> int:
        """What the usage would have earned with no protection: gross − provider cost."""
        return self.gross_micros - self.cost_micros

    @property
    def margin_after_micros(self) -> int:
        """What it earned: billed − provider cost (held runs earn nothing until decided)."""
        return self.billed_micros - self.cost_micros

    @property
    def credited_cost_micros(self) -> int:
        """Provider cost of the credited usage: what protection cost ("restored cost")."""
        return sum(amount for _, amount in self.credited_cost_by_rule)

    def by_rule(self) -> dict[str, int]:
        return dict(self.credited_by_rule)

    def cost_by_rule(self) -> dict[str, int]:
        return dict(self.credited_cost_by_rule)

    def __add__(self, other: Figures) -> Figures:
        totals: dict[str, Any] = {
            f.name: getattr(self, f.name) + getattr(other, f.name)
            for f in fields(self)
            if f.name not in BY_KIND
        }
        for name in BY_KIND:
            totals[name] = _add_by_kind(getattr(self, name), getattr(other, name))
        return Figures(**totals)


@dataclass(frozen=True, slots=True)
class CustomerProtection:
    customer_id: str
    figures: Figures
    # Billed and credited in the customer's billing currency; None while it is not known.
    invoice: InvoiceFigures | None = None


@dataclass(frozen=True, slots=True)
class ProtectionReport:
    tenant_id: str
    period: str
    customers: tuple[CustomerProtection, ...]  # by customer id
    total: Figures
    top_by_restored_cost: tuple[CustomerProtection, ...]


def decided_lines(lines: Iterable[CostedLine], gross_micros: int) -> tuple[CostedLine, ...]:
    """The lines a decision covered: the run's lines by id until they reach its gross.

    Usage that arrives after a decision waits for the next one; ingest numbers a run's lines
    under the run's lock, so the lines a decision saw are the lowest-numbered ones. Raises
    ValueError when the run's lines cannot make up the decided gross.
    """
    decided: list[CostedLine] = []
    total = 0
    for line in sorted(lines, key=lambda line: line.line_id):
        if total == gross_micros and line.gross_micros > 0:
            break
        decided.append(line)
        total += line.gross_micros
    if total != gross_micros:
        raise ValueError(f"the lines add up to {total}, not the decided {gross_micros}")
    return tuple(decided)


def _cost(lines: Iterable[CostedLine]) -> int:
    return sum(line.cost_micros or 0 for line in lines)


def run_figures(run: SettledRun) -> Figures:
    """One run's figures; raises ValueError for amounts no decision can have."""
    uncosted = [line for line in run.lines if line.cost_micros is None]
    common: dict[str, Any] = {
        "runs": 1,
        "gross_micros": run.gross_micros,
        "cost_micros": _cost(run.lines),
        "uncosted_lines": len(uncosted),
        "uncosted_gross_micros": sum(line.gross_micros for line in uncosted),
    }
    if sum(line.gross_micros for line in run.lines) != run.gross_micros:
        raise ValueError(f"run {run.run_id}: its lines do not add up to its gross")
    if run.held:
        return Figures(**common, held_micros=run.gross_micros)
    if run.billed_micros + run.credited_micros != run.gross_micros:
        raise ValueError(f"run {run.run_id}: billed + credited is not gross")
    by_rule = dict.fromkeys(CREDIT_KINDS, 0)
    cost_by_rule = dict.fromkeys(CREDIT_KINDS, 0)
    for line in run.lines:
        kind = run.credited_by_line.get(line.line_id)
        if kind is not None:
            by_rule[kind] += line.gross_micros
            cost_by_rule[kind] += line.cost_micros or 0
    support = run.credited_micros - sum(by_rule.values())
    if support < 0:
        raise ValueError(f"run {run.run_id}: its credited lines exceed what it credits")
    by_rule[SUPPORT] = support
    cost_by_rule[SUPPORT] = _support_cost(run, support)
    return Figures(
        **common,
        billed_micros=run.billed_micros,
        credited_micros=run.credited_micros,
        credited_by_rule=tuple(by_rule.items()),
        credited_cost_by_rule=tuple(cost_by_rule.items()),
    )


def _support_cost(run: SettledRun, support_micros: int) -> int:
    """Support credits an amount, not lines: its cost is that share of the cost of the
    lines the policy billed (the lines support's credit comes off)."""
    billed_lines = [line for line in run.lines if line.line_id not in run.credited_by_line]
    billed_gross = sum(line.gross_micros for line in billed_lines)
    if support_micros == 0 or billed_gross == 0:
        return 0
    return round_half_even_div(support_micros * _cost(billed_lines), billed_gross)


def build_report(
    tenant_id: str, period: str, runs: Iterable[SettledRun], *, top: int = TOP_CUSTOMERS
) -> ProtectionReport:
    """Fold runs (streamed: each is read once and not kept) into the period's report."""
    by_customer: dict[str, Figures] = {}
    for run in runs:
        by_customer[run.customer_id] = by_customer.get(run.customer_id, Figures()) + (
            run_figures(run)
        )
    customers = tuple(CustomerProtection(c, f) for c, f in sorted(by_customer.items()))
    total = sum((c.figures for c in customers), Figures())
    ranked = sorted(
        (c for c in customers if c.figures.credited_cost_micros > 0),
        key=lambda c: (-c.figures.credited_cost_micros, c.customer_id),
    )
    return ProtectionReport(tenant_id, period, customers, total, tuple(ranked[:top]))
