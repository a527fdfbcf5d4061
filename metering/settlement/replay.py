"""What-if: replay a period's settled runs through ``decide`` under a candidate policy.

Read-only (the transaction is set READ ONLY before anything is read): it loads each run's
facts, decides it under the candidate and applies support's credits and releases, as
settlement would. A sample of the runs (the first ``CHECK_ALL`` and one in ``CHECK_EVERY``
after them; every run when asked) is also decided under the policy version that made its
decision, which must reproduce the stored decision exactly; the report counts the runs
checked and reproduced, so a replay that drifted from settlement shows itself.

Speed (issue #17 asks for 100,000 runs in seconds): each decision keeps the facts it was
made on (``decided_facts.py``), so a run's facts are one value read with its decision and
decoded into the policy's structs in C, and the provider cost of each line is priced from
the model and tokens kept beside it. A decision without that record (made before it was
kept) has its facts read from the tables the way ``decide`` uses them: ``run.usage`` events
are not read (ingest stores each with exactly one usage line carrying its time and its
name, one statement, ``metering/ingest/store.py``, and the policy reads nothing of a usage
event that its line does not carry); the usage query brings the tokens too.

A replay sees the facts a run was decided on: evidence that arrived after its decision and
has not re-settled it yet is not in them (nor in the stored decision the check compares).

The R8 cap reads the customer's period as it stood when the run was decided (recorded on the
decision). Under the candidate, the automatic credits and refunds of the customer's runs
that ended earlier are adjusted by what the candidate changes for them. Decisions made
before the period inputs were recorded replay with the period built up in end order.

Rows come in PostgreSQL's binary format (a quarter less of the process's time to read
usage lines than text: no timestamps or integers parsed from text). Runs are streamed
through a server-side cursor in batches, in (customer, end, id) order, so
memory holds one batch and the per-customer sums, not the period.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import msgspec
import psycopg

from metering.policies.versions import list_versions
from metering.policy import HELD_FOR_REVIEW, REFUNDED, CustomerPeriod, Decision, RunFacts, decide
from metering.policy.document import PolicyDocument
from metering.policy.ending import ending_of_events
from metering.policy.facts import EventFact, PolicyConfig, UsageLine
from metering.policy.support import SupportGrant, apply_support, covered_credit_micros
from metering.prices import PROVIDER_COSTS, load_catalog
from metering.pricing import PriceCatalog
from metering.settlement.decided_facts import LinePricing, decode_decided_facts

BATCH = 2_000
EXAMPLES = 5
CHECK_ALL = 1_000  # runs of a replay (of each shard) all checked against their stored decision
CHECK_EVERY = 16  # then one run in this many

RUNS = """
SELECT r.id, r.subject, r.customer_id, r.ended_at, r.terminal_at IS NULL, r.support_released,
       r.auto_credited_micros, d.outcome, d.billed_micros, d.credited_micros,
       d.credited_line_ids, d.rule_ids, d.evidence_event_ids, d.explanation, d.policy_version,
       d.period_gross_micros, d.period_auto_credited_micros, d.period_auto_refunded_runs,
       r.gross_micros, r.support_credit_micros > 0, d.facts
FROM runs r JOIN decisions d ON d.run_id = r.id AND d.version = r.decision_version
WHERE r.tenant_id = %(tenant)s AND r.period = %(period)s AND r.decision_version > 0
  AND (hashtext(r.customer_id) & 2147483647) %% %(shards)s = %(shard)s
ORDER BY r.customer_id, r.ended_at, r.id
"""


@dataclass
class Position:
    """What a period's runs come to: billed, credited, and held for review (unposted); and
    what their usage cost the platform at the provider (the cost catalog), all of it and the
    part in the lines credited — what protection costs. Margin after protection is billed
    minus all of it."""

    billed_micros: int = 0
    credited_micros: int = 0
    held_micros: int = 0
    provider_cost_micros: int = 0
    credited_provider_cost_micros: int = 0

    @property
    def margin_after_micros(self) -> int:
        return self.billed_micros - self.provider_cost_micros

    # The figures a what-if reports of a position, in the order the API and the CSV give
    # them (each fact once: the reply and the export both read these two).
    FIGURES = (
        "billed_micros",
        "credited_micros",
        "held_micros",
        "provider_cost_micros",
        "credited_provider_cost_micros",
        "margin_after_micros",
    )

    def figures(self) -> tuple[int, ...]:
        return tuple(getattr(self, name) for name in self.FIGURES)

    def merge(self, other: Position) -> None:
        self.billed_micros += other.billed_micros
        self.credited_micros += other.credited_micros
        self.held_micros += other.held_micros
        self.provider_cost_micros += other.provider_cost_micros
        self.credited_provider_cost_micros += other.credited_provider_cost_micros

    def add(
        self, outcome: str, gross: int, billed: int, credited: int, cost: int, credited_cost: int
    ) -> None:
        self.provider_cost_micros += cost
        if outcome == HELD_FOR_REVIEW:
            self.held_micros += gross
        else:
            self.billed_micros += billed
            self.credited_micros += credited
            self.credited_provider_cost_micros += credited_cost


@dataclass
class Side:
    current: Position = field(default_factory=Position)
    candidate: Position = field(default_factory=Position)


@dataclass
class Change:
    runs: int = 0
    examples: list[str] = field(default_factory=list)


@dataclass
class WhatIf:
    period: str
    candidate: PolicyDocument
    runs: int = 0
    checked: int = 0  # runs also replayed under the policy that decided them
    reproduced: int = 0  # checked runs whose replay there equals the stored decision
    not_reproduced: list[str] = field(default_factory=list)  # a few examples
    # Usage lines of a model the cost catalog has no cost for (counted at no cost).
    uncosted_lines: int = 0
    total: Side = field(default_factory=Side)
    customers: dict[str, Side] = field(default_factory=dict)
    changes: dict[tuple[str, str], Change] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Run:
    run_id: int
    subject: str
    customer: str
    abandoned: bool
    released: bool
    auto_credited_micros: int
    stored: tuple[Any, ...]  # outcome, billed, credited, line ids, rules, evidence, words
    policy_version: int
    recorded: CustomerPeriod | None
    gross_micros: int
    ended_at: datetime
    has_grants: bool
    facts: bytes | None  # the facts it was decided on, as settlement kept them (or None)


@dataclass(frozen=True)
class Shard:
    """One of ``of`` disjoint sets of a period's customers (by a hash of the customer id):
    the R8 cap reads a customer's runs in end order, so a customer is never split."""

    index: int = 0
    of: int = 1


def _runs(
    conn: psycopg.Connection[Any], tenant: str, period: str, shard: Shard
) -> Iterator[list[_Run]]:
    # One query through a server-side cursor: sorted once, fetched a batch at a time (paging
    # with a key re-sorted the period for every batch, quadratic in its runs).
    with conn.cursor(name="what_if_runs", binary=True) as cursor:
        params = {"tenant": tenant, "period": period, "shards": shard.of, "shard": shard.index}
        cursor.execute(RUNS, params)
        while rows := cursor.fetchmany(BATCH):
            yield [_run(row) for row in rows]


def _run(row: tuple[Any, ...]) -> _Run:
    recorded = None
    if row[15] is not None:
        recorded = CustomerPeriod(int(row[15]), int(row[16]), int(row[17]))
    stored = (row[7], row[8], row[9], tuple(row[10]), tuple(row[11]), tuple(row[12]), row[13])
    return _Run(
        run_id=row[0],
        subject=row[1],
        customer=row[2],
        abandoned=row[4],
        released=row[5],
        auto_credited_micros=int(row[6]),
        stored=stored,
        policy_version=row[14],
        recorded=recorded,
        gross_micros=int(row[18]),
        ended_at=row[3],
        has_grants=row[19],
        facts=row[20],
    )


REPLAY_EVENTS = """
SELECT run_id, source || '/' || event_id, type, time, data::text FROM events
WHERE run_id = ANY(%(ids)s) AND type <> 'run.usage'
"""

REPLAY_USAGE = """
SELECT u.run_id, u.id, '', u.step, u.attempt, u.tool_call_id, u.replay, u.gross_micros,
       u.time, u.model, u.input_tokens, u.cached_input_tokens, u.output_tokens
FROM usage_lines u
WHERE u.run_id = ANY(%(ids)s)
"""

# A usage line's name ("source/id" of its event) is cited only as evidence, which the
# candidate's decision is not asked for; looking it up costs a probe of the events' primary
# key per line, so only the runs checked against their stored decision are read with it.
# The line's received_at is its event's: the probe reads that month's partition only. A
# line whose month of raw events was archived keeps its place, without a name.
REPLAY_USAGE_NAMED = """
SELECT u.run_id, u.id, coalesce(e.source || '/' || e.event_id, ''), u.step, u.attempt,
       u.tool_call_id, u.replay, u.gross_micros, u.time, u.model, u.input_tokens,
       u.cached_input_tokens, u.output_tokens
FROM usage_lines u
LEFT JOIN events e
       ON e.id = u.event_pk AND e.tenant_id = u.tenant_id AND e.received_at = u.received_at
WHERE u.run_id = ANY(%(ids)s)
"""


@dataclass
class _Facts:
    """A batch's facts as ``decide`` reads them, and the provider cost of each usage line."""

    events: dict[int, list[EventFact]]
    usage: dict[int, list[UsageLine]]
    line_costs: dict[int, dict[int, int]]
    grants: dict[int, list[SupportGrant]]


def _facts(
    conn: psycopg.Connection[Any],
    runs: list[_Run],
    checks: set[int],
    costs: PriceCatalog,
    report: WhatIf,
) -> _Facts:
    """The batch's facts: from the record each decision kept where it has one, else read
    from the tables (decisions made before records were kept)."""
    facts = _Facts({}, {}, {}, {})
    unrecorded: list[_Run] = []
    for run in runs:
        decided = decode_decided_facts(run.facts)
        if decided is None:
            unrecorded.append(run)
            continue
        facts.events[run.run_id] = list(decided.events)
        facts.usage[run.run_id] = list(decided.usage)
        facts.line_costs[run.run_id] = _line_costs(decided.usage, decided.pricing, costs, report)
    if unrecorded:
        checked = sorted(r.run_id for r in unrecorded if r.run_id in checks)
        _read_facts(conn, unrecorded, checked, costs, report, into=facts)
    with_grants = [r.run_id for r in runs if r.has_grants]
    if with_grants:
        facts.grants.update(_grants(conn, with_grants))
    return facts


def _line_costs(
    usage: tuple[UsageLine, ...],
    pricing: tuple[LinePricing, ...],
    costs: PriceCatalog,
    report: WhatIf,
) -> dict[int, int]:
    total_micros, priced = costs.total_micros, {}
    for line, (model, input_tokens, cached_input_tokens, output_tokens) in zip(
        usage, pricing, strict=True
    ):
        cost = total_micros(model, input_tokens, cached_input_tokens, output_tokens, line.time)
        if cost is None:  # a model the cost catalog has no cost for: counted, at none
            cost = 0
            report.uncosted_lines += 1
        priced[line.line_id] = cost
    return priced


def _read_facts(
    conn: psycopg.Connection[Any],
    runs: list[_Run],
    checked: list[int],
    costs: PriceCatalog,
    report: WhatIf,
    *,
    into: _Facts,
) -> None:
    """The facts of runs whose decision kept no record, from the events and usage-line
    tables; the usage lines of runs not in ``checked`` have no name (their candidate
    decision's evidence ids are not read, and nothing else reads a name)."""
    params = {"ids": [r.run_id for r in runs]}
    event_rows = conn.cursor(binary=True).execute(REPLAY_EVENTS, params).fetchall()
    bodies = msgspec.json.decode("[" + ",".join(row[4] for row in event_rows) + "]")
    events = into.events
    for (run_id, event_id, type_, time, _), data in zip(event_rows, bodies, strict=True):
        events.setdefault(run_id, []).append(EventFact(event_id, type_, time, data))
    usage, line_costs = into.usage, into.line_costs
    named = set(checked)
    reads = conn.cursor(binary=True)
    usage_rows = reads.execute(
        REPLAY_USAGE, {"ids": [r.run_id for r in runs if r.run_id not in named]}
    ).fetchall()
    if checked:
        usage_rows += reads.execute(REPLAY_USAGE_NAMED, {"ids": checked}).fetchall()
    # The loop over every usage line of such runs: local names, no helper calls.
    total_micros, uncosted = costs.total_micros, 0
    for run_id, line_id, name, step, attempt, tool, replay_, gross, at, *priced in usage_rows:
        lines = usage.get(run_id)
        if lines is None:
            lines = usage[run_id] = []
            line_costs[run_id] = {}
        lines.append(UsageLine(line_id, name, step, attempt, tool, replay_, gross, at))
        model, input_tokens, cached_input_tokens, output_tokens = priced
        cost = total_micros(model, input_tokens, cached_input_tokens, output_tokens, at)
        if cost is None:  # a model the cost catalog has no cost for: counted, at none
            cost, uncosted = 0, uncosted + 1
        line_costs[run_id][line_id] = cost
    report.uncosted_lines += uncosted


def _grants(conn: psycopg.Connection[Any], run_ids: list[int]) -> dict[int, list[SupportGrant]]:
    grants: dict[int, list[SupportGrant]] = {}
    for run_id, amount, covers in conn.execute(
        "SELECT run_id, amount_micros, covers_line_id FROM support_credits "
        "WHERE run_id = ANY(%s) ORDER BY run_id, grant_no",
        (run_ids,),
    ).fetchall():
        grants.setdefault(run_id, []).append(SupportGrant(amount, covers))
    return grants


def _comparable(decision: Decision) -> tuple[Any, ...]:
    return (
        decision.outcome,
        decision.billed_micros,
        decision.credited_micros,
        decision.credited_line_ids,
        decision.rule_ids,
        decision.evidence_event_ids,
        decision.explanation,
    )


@dataclass
class _Running:
    """A customer's period as the replay goes: gross so far, and the candidate's changes."""

    gross_micros: int = 0
    credited_micros: int = 0  # automatic credits so far under the policy replayed
    refunded_runs: int = 0
    credit_delta_micros: int = 0  # candidate − stored automatic credits of earlier runs
    refund_delta: int = 0


def _period(run: _Run, running: _Running, *, candidate: bool) -> CustomerPeriod:
    if run.recorded is None:
        return CustomerPeriod(
            running.gross_micros + run.gross_micros, running.credited_micros, running.refunded_runs
        )
    if not candidate:
        return run.recorded
    return CustomerPeriod(
        run.recorded.period_gross_micros,
        max(0, run.recorded.auto_credited_micros + running.credit_delta_micros),
        max(0, run.recorded.auto_refunded_runs + running.refund_delta),
    )


def _auto(decision: Decision) -> tuple[int, int]:
    """(automatic credit, automatically refunded runs) of a policy decision, as R8 counts."""
    automatic = decision.outcome in (REFUNDED, "partially_credited")
    credit = decision.credited_micros if automatic else 0
    return credit, int(decision.outcome == REFUNDED and credit > 0)


def replay_period(
    conn: psycopg.Connection[Any],
    tenant: str,
    period: str,
    candidate: PolicyDocument,
    defaults: PolicyDocument,
    *,
    check_all: bool = False,
    shard: Shard = Shard(),
) -> WhatIf:
    """Replay the tenant's runs settled in ``period`` (YYYY-MM) under ``candidate`` (only
    the customers of ``shard``); ``check_all`` checks every run against its stored
    decision, not a sample."""
    with collector_paused():
        return _replay(conn, tenant, period, candidate, defaults, check_all, shard)


_paused = 0
_was_enabled = True
_paused_lock = threading.Lock()


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while replays run (on again after the last).

    A replay allocates millions of small objects (facts, decisions) that reference counting
    frees and that form no cycles; the collector, triggered by allocation counts, walked
    them over and over: two fifths of a replay's time (bench/whatif.py).
    """
    global _paused, _was_enabled
    with _paused_lock:
        if _paused == 0:
            _was_enabled = gc.isenabled()
        _paused += 1
        gc.disable()
    try:
        yield
    finally:
        with _paused_lock:
            _paused -= 1
            if _paused == 0 and _was_enabled:
                gc.enable()


def _replay(
    conn: psycopg.Connection[Any],
    tenant: str,
    period: str,
    candidate: PolicyDocument,
    defaults: PolicyDocument,
    check_all: bool,
    shard: Shard,
) -> WhatIf:
    conn.execute("SET TRANSACTION READ ONLY")
    configs: dict[int, PolicyConfig] = {
        v.version: v.document.config() for v in list_versions(conn, tenant, defaults)
    }
    config = candidate.config()
    report = WhatIf(period, candidate)
    running: dict[str, _Running] = {}
    costs = load_catalog(conn, PROVIDER_COSTS)
    for batch in _runs(conn, tenant, period, shard):
        checks = {
            run.run_id
            for i, run in enumerate(batch, start=report.runs)
            if check_all or i < CHECK_ALL or i % CHECK_EVERY == 0
        }
        facts_of = _facts(conn, batch, checks, costs, report)
        for run in batch:
            state = running.setdefault(run.customer, _Running())
            events = tuple(facts_of.events.get(run.run_id, ()))
            usage = tuple(facts_of.usage.get(run.run_id, ()))
            grants = facts_of.grants.get(run.run_id, [])
            if run.run_id in checks:
                facts = RunFacts(events, usage, run.abandoned, _period(run, state, candidate=False))
                own_policy = configs[run.policy_version]
                _check(report, run, _settle(run, facts, grants, own_policy, explained=True)[1])
            facts = RunFacts(events, usage, run.abandoned, _period(run, state, candidate=True))
            new_made, new = _settle(run, facts, grants, config, explained=False)
            _tally(report, run, new, facts_of.line_costs.get(run.run_id, {}))
            _advance(state, run, new_made)
    return report


def _settle(
    run: _Run,
    facts: RunFacts,
    grants: list[SupportGrant],
    policy: PolicyConfig,
    *,
    explained: bool,
) -> tuple[Decision, Decision]:
    """(the policy's decision, the decision after support), as ``settle_runs`` makes them."""
    made = decide(facts, policy, explained=explained)
    if not grants and not run.released:
        return made, made  # what apply_support gives back when support did nothing
    return made, apply_support(
        made,
        extra_credit_micros=covered_credit_micros(grants, facts.usage, made.credited_line_ids),
        released=run.released,
        ending=ending_of_events(facts.events),
    )


def _advance(state: _Running, run: _Run, new: Decision) -> None:
    """The customer's period after ``run``: the stored automatic credit and refund (what
    settlement counted, which a checked replay reproduces), and the candidate's change."""
    new_credit, new_refund = _auto(new)
    stored_refund = int(run.stored[0] == REFUNDED and run.auto_credited_micros > 0)
    state.gross_micros += run.gross_micros
    state.credited_micros += run.auto_credited_micros
    state.refunded_runs += stored_refund
    state.credit_delta_micros += new_credit - run.auto_credited_micros
    state.refund_delta += new_refund - stored_refund


def _check(report: WhatIf, run: _Run, own: Decision) -> None:
    report.checked += 1
    if _comparable(own) == run.stored:
        report.reproduced += 1
    elif len(report.not_reproduced) < EXAMPLES:
        report.not_reproduced.append(run.subject)


def _tally(report: WhatIf, run: _Run, new: Decision, line_costs: dict[int, int]) -> None:
    report.runs += 1
    side = report.customers.setdefault(run.customer, Side())
    outcome, billed, credited = run.stored[0], run.stored[1], run.stored[2]
    cost = sum(line_costs.values())
    was_credited = sum(line_costs.get(i, 0) for i in run.stored[3])
    now_credited = sum(line_costs.get(i, 0) for i in new.credited_line_ids)
    for position in (side.current, report.total.current):
        position.add(outcome, run.gross_micros, billed, credited, cost, was_credited)
    for position in (side.candidate, report.total.candidate):
        position.add(
            new.outcome,
            run.gross_micros,
            new.billed_micros,
            new.credited_micros,
            cost,
            now_credited,
        )
    if new.outcome != outcome:
        change = report.changes.setdefault((outcome, new.outcome), Change())
        change.runs += 1
        if len(change.examples) < EXAMPLES:
            change.examples.append(run.subject)


def merge_reports(reports: list[WhatIf]) -> WhatIf:
    """One report of the shards' reports (disjoint customers) of one period and candidate."""
    merged = WhatIf(reports[0].period, reports[0].candidate)
    for report in reports:
        merged.runs += report.runs
        merged.checked += report.checked
        merged.reproduced += report.reproduced
        merged.uncosted_lines += report.uncosted_lines
        merged.not_reproduced.extend(report.not_reproduced)
        merged.total.current.merge(report.total.current)
        merged.total.candidate.merge(report.total.candidate)
        merged.customers.update(report.customers)
        for key, change in report.changes.items():
            into = merged.changes.setdefault(key, Change())
            into.runs += change.runs
            into.examples.extend(change.examples)
    merged.not_reproduced = merged.not_reproduced[:EXAMPLES]
    for change in merged.changes.values():
        change.examples = change.examples[:EXAMPLES]
    return merged
