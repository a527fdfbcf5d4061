"""The oracle: what the books must say, computed from the events that were sent.

``expected_books`` prices every usage event at its own time and applies the outcome its
scenario kind must settle to (``tests/helpers/scenarios.py``); ``check_books`` compares that
with what is stored, run by run and customer by customer, and checks the structural rules a
fault could break: every event stored once, one hold per usage line, one decision version
per run (no late evidence in these tests), every decision with exactly its postings, no run
pointing at a decision that is not there, nothing parked or left claimed.
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from metering.prices import load_catalog
from metering.pricing import PriceCatalog, TokenCounts
from tests.helpers.scenarios import KINDS, scenario

REFUNDED, PARTIAL, HELD = "refunded", "partially_credited", "held_for_review"


@dataclass(frozen=True, slots=True)
class ExpectedRun:
    customer: str
    outcome: str
    gross_micros: int
    billed_micros: int  # the ledger position: 0 while held for review
    credited_micros: int
    usage_lines: int


@dataclass
class Workload:
    """Runs made from scenario kinds, and every event sent for them (resends included)."""

    kinds: dict[str, str]  # run → scenario kind
    events: list[dict[str, Any]]

    @classmethod
    def make(cls, runs: int, customers: int, start: datetime, *, prefix: str = "run") -> Workload:
        """``runs`` runs of random kinds (seeded), spread over ``customers`` customers; keep
        it ≤ 20 runs per customer, so the protection cap R8 never holds a run."""
        kinds, events = {}, []
        rng = random.Random(f"{prefix}/{runs}")
        for i in range(runs):
            run, kind = f"{prefix}-{i}", rng.choice(sorted(KINDS))
            kinds[run] = kind
            events += scenario(kind, run, f"cust-{i % customers}", start)
        return cls(kinds, events)

    def customers(self) -> list[str]:
        return sorted({e["data"]["customer"] for e in self.events})

    def by_run(self) -> dict[str, list[dict[str, Any]]]:
        grouped: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for event in self.events:
            grouped[event["subject"]].append(event)
        return grouped

    def batches(self, runs_per_batch: int) -> list[list[dict[str, Any]]]:
        grouped = list(self.by_run().values())
        return [
            [event for run in grouped[i : i + runs_per_batch] for event in run]
            for i in range(0, len(grouped), runs_per_batch)
        ]


def _time(event: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(event["time"].replace("Z", "+00:00"))


def expected_books(workload: Workload, catalog: PriceCatalog) -> dict[str, ExpectedRun]:
    unique = {(e["source"], e["id"]): e for e in workload.events}.values()
    by_run: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for event in unique:
        by_run[event["subject"]].append(event)
    expected = {}
    for run, events in by_run.items():
        outcome = KINDS[workload.kinds[run]]
        lines = []
        for e in events:
            if e["type"] != "run.usage":
                continue
            d = e["data"]
            tokens = TokenCounts(
                d["input_tokens"], d.get("cached_input_tokens", 0), d["output_tokens"]
            )
            lines.append(
                (d["step"], catalog.price_usage(d["model"], tokens, _time(e)).total_micros)
            )
        gross = sum(cost for _, cost in lines)
        delivered = max(
            (e["data"]["step"] for e in events if e["type"] == "run.delivered"), default=0
        )
        billed = {
            "confirmed": gross,
            REFUNDED: 0,
            PARTIAL: sum(cost for step, cost in lines if step <= delivered),
            HELD: 0,
        }[outcome]
        credited = 0 if outcome == HELD else gross - billed
        expected[run] = ExpectedRun(
            events[0]["data"]["customer"], outcome, gross, billed, credited, len(lines)
        )
    return expected


@dataclass(frozen=True, slots=True)
class BooksSummary:
    runs: int
    events: int
    decisions: int
    postings: int


def check_books(db: Any, workload: Workload) -> BooksSummary:
    """Assert the stored books equal the oracle; return what was checked."""
    expected = expected_books(workload, load_catalog(db))
    sent = {(e["source"], e["id"]) for e in workload.events}
    stored = db.execute("SELECT source, event_id FROM events").fetchall()
    assert len(stored) == len(set(stored)), "an event is stored twice"
    missing, extra = sent - set(stored), set(stored) - sent
    assert not missing and not extra, f"{len(missing)} events lost, {len(extra)} unexpected"

    _check_holds(db, expected)
    _check_runs(db, expected)
    _check_decisions_and_postings(db, expected)
    _check_customers(db, expected)
    (decisions,) = db.execute("SELECT count(*) FROM decisions").fetchone()
    (postings,) = db.execute("SELECT count(*) FROM ledger_entries WHERE kind <> 'hold'").fetchone()
    return BooksSummary(len(expected), len(sent), decisions, postings)


def _check_holds(db: Any, expected: Mapping[str, ExpectedRun]) -> None:
    lines = sum(run.usage_lines for run in expected.values())
    (stored_lines,) = db.execute("SELECT count(*) FROM usage_lines").fetchone()
    assert stored_lines == lines, f"{stored_lines} usage lines for {lines} usage events"
    double = db.execute(
        "SELECT usage_line_id FROM ledger_entries WHERE kind = 'hold' "
        "GROUP BY 1 HAVING count(*) <> 1"
    ).fetchall()
    (holds,) = db.execute("SELECT count(*) FROM ledger_entries WHERE kind = 'hold'").fetchone()
    assert not double and holds == lines, f"{holds} holds for {lines} usage lines"


def _check_runs(db: Any, expected: Mapping[str, ExpectedRun]) -> None:
    rows = db.execute(
        "SELECT subject, customer_id, outcome, decision_version, gross_micros, billed_micros, "
        "credited_micros, parked_at IS NOT NULL, claimed_until IS NOT NULL, "
        "settled_evidence_version = evidence_version FROM runs"
    ).fetchall()
    actual = {r[0]: r[1:] for r in rows}
    assert set(actual) == set(expected), "runs differ from the runs that were sent"
    wrong = {
        run: (actual[run], want)
        for run, want in expected.items()
        if actual[run]
        != (
            want.customer,
            want.outcome,
            1,
            want.gross_micros,
            want.billed_micros,
            want.credited_micros,
            False,
            False,
            True,
        )
    }
    if wrong:
        run, (got, want) = next(iter(wrong.items()))
        raise AssertionError(
            f"{len(wrong)} runs differ from the oracle, e.g. {run}: {got} != {want}\n"
            + describe(db, run)
        )


def _check_decisions_and_postings(db: Any, expected: Mapping[str, ExpectedRun]) -> None:
    versions = dict(
        db.execute(
            "SELECT r.subject, array_agg(d.version ORDER BY d.version) FROM runs r "
            "LEFT JOIN decisions d ON d.run_id = r.id GROUP BY r.subject"
        ).fetchall()
    )
    not_once = {run: v for run, v in versions.items() if v != [1]}
    assert not not_once, f"runs not decided exactly once: {not_once}\n" + "".join(
        describe(db, run) for run in list(not_once)[:3]
    )
    orphans = db.execute(
        "SELECT count(*) FROM ledger_entries l WHERE kind <> 'hold' AND NOT EXISTS ("
        "SELECT 1 FROM decisions d WHERE d.run_id = l.run_id AND d.version = l.decision_version)"
    ).fetchone()
    assert orphans == (0,), "postings without their decision"
    postings: dict[str, Counter[str]] = defaultdict(Counter)
    for run, kind, amount in db.execute(
        "SELECT r.subject, l.kind, l.amount_micros FROM ledger_entries l "
        "JOIN runs r ON r.id = l.run_id WHERE l.kind <> 'hold'"
    ).fetchall():
        assert kind != "correction" and postings[run][kind] == 0, f"{run}: a second {kind}"
        postings[run][kind] += amount
    for run, want in expected.items():
        got = (postings[run]["post"], postings[run]["release"])
        assert got == (want.billed_micros, want.credited_micros), f"{run}: postings {got}"


def _check_customers(db: Any, expected: Mapping[str, ExpectedRun]) -> None:
    oracle: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for run in expected.values():
        sums = oracle[run.customer]
        sums[0] += run.gross_micros
        sums[1] += run.billed_micros
        sums[2] += run.credited_micros
    rows = db.execute(
        "SELECT customer_id, coalesce(sum(amount_micros) FILTER (WHERE kind = 'hold'), 0), "
        "coalesce(sum(amount_micros) FILTER (WHERE kind = 'post'), 0), "
        "coalesce(sum(amount_micros) FILTER (WHERE kind = 'release'), 0) "
        "FROM ledger_entries GROUP BY 1"
    ).fetchall()
    ledger = {customer: [int(h), int(p), int(r)] for customer, h, p, r in rows}
    assert ledger == dict(oracle), "per-customer holds/posts/releases differ from the oracle"


def describe(db: Any, run: str) -> str:
    """A run's events, decisions and postings, for failure messages."""
    queries = {
        "events": "SELECT e.source, e.event_id, e.type, e.time, e.received_at FROM events e "
        "JOIN runs r ON r.id = e.run_id WHERE r.subject = %s ORDER BY e.id",
        "decisions": "SELECT d.version, d.outcome, d.billed_micros, d.credited_micros, "
        "d.rule_ids, d.evidence_version, d.decided_at, d.origin FROM decisions d "
        "JOIN runs r ON r.id = d.run_id WHERE r.subject = %s ORDER BY d.version",
        "ledger": "SELECT l.kind, l.amount_micros, l.decision_version, l.corrects FROM "
        "ledger_entries l JOIN runs r ON r.id = l.run_id WHERE r.subject = %s ORDER BY l.id",
        "run": "SELECT * FROM runs WHERE subject = %s",
    }
    lines = [f"--- {run}"]
    for name, sql in queries.items():
        lines += [f"{name}:"] + [f"  {row}" for row in db.execute(sql, (run,)).fetchall()]
    return "\n".join(lines) + "\n"


def stored_runs(db: Any) -> int:
    (count,) = db.execute("SELECT count(*) FROM runs").fetchone()
    return int(count)


def settled_runs(db: Any, *, prefix: str = "") -> int:
    """Runs decided so far; with ``prefix``, only one workload's (its subjects start so)."""
    (count,) = db.execute(
        "SELECT count(*) FROM runs WHERE decision_version > 0 AND subject LIKE %s",
        (f"{prefix}%",),
    ).fetchone()
    return int(count)


def all_settled(db: Any, total: int) -> bool:
    """At least ``total`` runs are decided and their decisions have seen all their events."""
    (count,) = db.execute(
        "SELECT count(*) FROM runs WHERE decision_version > 0 "
        "AND settled_evidence_version = evidence_version"
    ).fetchone()
    return int(count) >= total
