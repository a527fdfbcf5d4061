"""The report over a simulated month of mixed runs (drops on either side, resumes with
replayed context, re-executed tool calls, partial deliveries, holds), settled for real.

The decisions table is the truth: the report's totals must equal its sums, and re-deriving
which rule credited each line must account for every credited line (nothing left ``other``).
"""

from __future__ import annotations

from datetime import UTC, datetime

from devtools.simulator.plan import TrafficSpec, default_customers, plan_traffic
from metering.db import raw_transaction
from metering.policy import PolicyConfig
from metering.pricing import PriceCatalog
from metering.protection.query import protection_report
from metering.protection.report import RULES, SUPPORT, UNATTRIBUTED
from metering.settlement.runner import settle_due_now
from tests.helpers.catalog import stable_prices
from tests.helpers.ingest import ingest

RUNS = 150


def test_every_credited_line_is_given_to_the_rule_that_credited_it(engine, settings, db):
    now = datetime.now(UTC).replace(microsecond=0)
    prefix = f"protect-{now:%H%M%S}"
    spec = TrafficSpec(
        seed=17, runs=RUNS, customers=default_customers(6, prefix), anchor=now, run_prefix=prefix
    )
    planned = plan_traffic(spec, PriceCatalog.from_prices(stable_prices()), PolicyConfig())
    for start in range(0, RUNS, 25):
        events = [e for run in planned[start : start + 25] for e in run.events]
        ingest(engine, settings, events, received_at=now)
    settle_due_now(engine, settings, now=now)
    truth = db.execute(
        "SELECT r.period, count(*), sum(d.gross_micros), "
        "sum(d.billed_micros) FILTER (WHERE d.outcome <> 'held_for_review'), "
        "sum(d.credited_micros) FILTER (WHERE d.outcome <> 'held_for_review'), "
        "sum(d.gross_micros) FILTER (WHERE d.outcome = 'held_for_review') "
        "FROM runs r JOIN decisions d ON d.run_id = r.id AND d.version = r.decision_version "
        "GROUP BY r.period"
    ).fetchall()
    assert sum(row[1] for row in truth) == RUNS
    fired = set()
    for period, runs, gross, billed, credited, held in truth:
        with raw_transaction(engine) as conn:
            total = protection_report(conn, "acme", period).total
        assert (total.runs, total.gross_micros) == (runs, gross)
        assert (total.billed_micros, total.credited_micros) == (billed or 0, credited or 0)
        assert total.held_micros == (held or 0)
        by_rule = total.by_rule()
        assert by_rule[UNATTRIBUTED] == 0 and by_rule[SUPPORT] == 0
        assert sum(by_rule.values()) == total.credited_micros
        assert total.uncosted_lines == 0
        fired |= {rule for rule in RULES if by_rule[rule]}
    # The month exercised every rule, and runs where several fired (whose lines are
    # attributed by running the rules again).
    multi = db.execute(
        "SELECT count(*) FROM runs r JOIN decisions d ON d.run_id = r.id "
        "AND d.version = r.decision_version WHERE d.outcome <> %s "
        "AND cardinality(ARRAY(SELECT unnest(d.rule_ids) INTERSECT SELECT unnest(%s::text[]))) > 1",
        ("held_for_review", list(RULES)),
    ).fetchone()[0]
    assert fired == set(RULES) and multi > 0, (fired, multi)
