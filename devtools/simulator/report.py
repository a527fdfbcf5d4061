"""Comparing what the server decided with what the simulator expected, as a text table."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from devtools.simulator.expected import Expectation
from devtools.simulator.plan import PlannedRun
from devtools.simulator.send import Delivery
from metering.money import format_usd
from metering.policy import OUTCOMES

COMPARED = (
    "outcome",
    "status",
    "gross_micros",
    "billed_micros",
    "credited_micros",
    "held_micros",
    "rule_ids",
)
NOT_SETTLED = "(not settled)"
MAX_LISTED = 50


@dataclass(frozen=True)
class Mismatch:
    run: PlannedRun
    actual: dict[str, Any] | None
    fields: tuple[str, ...]  # what differs; ("settled",) when the run was never settled


@dataclass(frozen=True)
class Totals:
    gross_micros: int = 0
    billed_micros: int = 0  # of settled runs not held for review
    credited_micros: int = 0  # "restored": of settled runs not held for review
    held_micros: int = 0  # held runs bill nothing until support resolves them


@dataclass
class SimulationReport:
    planned: Sequence[PlannedRun]
    actual: dict[str, dict[str, Any]]
    delivery: Delivery
    mismatches: list[Mismatch]
    refused_settles: dict[str, str] = field(default_factory=dict)
    description: str = ""
    settle_elapsed_s: float = 0.0  # from the last event delivered to the last run settled

    @property
    def ok(self) -> bool:
        delivered = not self.delivery.dead_letters and self.delivery.undelivered == 0
        return delivered and not self.mismatches and not self.refused_settles

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def expected_totals(self) -> Totals:
        return _totals([asdict(run.expected) for run in self.planned])

    def actual_totals(self) -> Totals:
        return _totals([self.actual[r.run_id] for r in self.planned if r.run_id in self.actual])

    def render(self) -> str:
        return "\n".join(
            [
                self.description,
                _delivery_line(self.delivery),
                f"settled (or given up) {self.settle_elapsed_s:.1f} s later",
                "",
                *_outcome_table(self),
                "",
                *_kind_table(self),
                "",
                *_money_table(self.expected_totals(), self.actual_totals()),
                "",
                *_problems(self),
            ]
        )


def _actual_value(actual: dict[str, Any], name: str) -> Any:
    value = actual.get(name)
    return tuple(value) if name == "rule_ids" and value is not None else value


def differences(expected: Expectation, actual: dict[str, Any] | None) -> tuple[str, ...]:
    if actual is None or not actual.get("settled") or actual.get("reopened"):
        return ("settled",)
    return tuple(n for n in COMPARED if getattr(expected, n) != _actual_value(actual, n))


def compare(planned: Sequence[PlannedRun], actual: dict[str, dict[str, Any]]) -> list[Mismatch]:
    mismatches = []
    for run in planned:
        reply = actual.get(run.run_id)
        if fields := differences(run.expected, reply):
            mismatches.append(Mismatch(run, reply, fields))
    return mismatches


def _totals(decisions: list[dict[str, Any]]) -> Totals:
    def total(name: str) -> int:
        return sum(int(decision.get(name) or 0) for decision in decisions)

    amounts = ("gross_micros", "billed_micros", "credited_micros", "held_micros")
    return Totals(*(total(name) for name in amounts))


def _outcome_of(reply: dict[str, Any] | None) -> str:
    if reply is None or not reply.get("settled") or reply.get("reopened"):
        return NOT_SETTLED
    return str(reply.get("outcome"))


def _delivery_line(delivery: Delivery) -> str:
    return (
        f"{delivery.events} events sent: {delivery.accepted} accepted, "
        f"{delivery.duplicates} duplicates, {len(delivery.dead_letters)} refused, "
        f"{delivery.undelivered} undelivered, in {delivery.elapsed_s:.1f} s"
    )


def _outcome_table(report: SimulationReport) -> list[str]:
    expected = Counter(run.expected.outcome for run in report.planned)
    actual = Counter(_outcome_of(report.actual.get(r.run_id)) for r in report.planned)
    failed = {m.run.run_id for m in report.mismatches}
    matched = Counter(r.expected.outcome for r in report.planned if r.run_id not in failed)
    lines = [f"{'outcome':<22}{'expected':>10}{'actual':>10}{'matched':>10}"]
    for outcome in (*OUTCOMES, NOT_SETTLED):
        lines.append(
            f"{outcome:<22}{expected[outcome]:>10}{actual[outcome]:>10}{matched[outcome]:>10}"
        )
    total = len(report.planned)
    lines.append(f"{'total':<22}{total:>10}{total:>10}{total - len(failed):>10}")
    return lines


def _kind_table(report: SimulationReport) -> list[str]:
    runs = Counter(run.scenario.kind.value for run in report.planned)
    failed = Counter(m.run.scenario.kind.value for m in report.mismatches)
    outcomes: dict[str, set[str]] = {}
    for run in report.planned:
        outcomes.setdefault(run.scenario.kind.value, set()).add(run.expected.outcome)
    lines = [f"{'run kind':<22}{'runs':>10}{'matched':>10}   expected outcome"]
    for kind, count in sorted(runs.items(), key=lambda item: (-item[1], item[0])):
        expected = ", ".join(sorted(outcomes[kind]))
        lines.append(f"{kind:<22}{count:>10}{count - failed[kind]:>10}   {expected}")
    capped = sum(run.capped for run in report.planned)
    if capped:
        lines.append(f"({capped} run(s) made clean to keep customers under the protection cap)")
    return lines


def _money_table(expected: Totals, actual: Totals) -> list[str]:
    rows = [
        ("gross", expected.gross_micros, actual.gross_micros),
        ("billed", expected.billed_micros, actual.billed_micros),
        ("restored (credited)", expected.credited_micros, actual.credited_micros),
        ("held for review", expected.held_micros, actual.held_micros),
    ]
    lines = [f"{'USD':<22}{'expected':>16}{'actual':>16}"]
    for name, ours, theirs in rows:
        lines.append(f"{name:<22}{format_usd(ours, 6):>16}{format_usd(theirs, 6):>16}")
    return lines


def _describe(values: dict[str, Any]) -> str:
    return (
        f"{values.get('outcome')} billed {values.get('billed_micros')} "
        f"credited {values.get('credited_micros')} {list(values.get('rule_ids') or [])}"
    )


def _problems(report: SimulationReport) -> list[str]:
    lines = [f"{len(report.mismatches)} mismatch(es)."]
    for mismatch in report.mismatches[:MAX_LISTED]:
        run = mismatch.run
        actual = "not settled" if mismatch.actual is None else _describe(mismatch.actual)
        lines.append(
            f"  {run.run_id} ({run.scenario.kind.value}, {run.scenario.customer}): "
            f"expected {_describe(asdict(run.expected))}; actual {actual}; "
            f"differs in {', '.join(mismatch.fields)}"
        )
    if len(report.mismatches) > MAX_LISTED:
        lines.append(f"  … and {len(report.mismatches) - MAX_LISTED} more")
    for letter in report.delivery.dead_letters[:MAX_LISTED]:
        lines.append(f"  refused event {letter.event_id}: {letter.status} {letter.code}")
    for run_id, reason in list(report.refused_settles.items())[:MAX_LISTED]:
        lines.append(f"  settle-now refused for {run_id}: {reason}")
    return lines
