"""The simulator: reproducible traffic, and a real service settling it as docs/policy.md says."""

from __future__ import annotations

import re
from dataclasses import asdict
from datetime import UTC, datetime

from click.testing import CliRunner

from cli.main import main
from devtools.simulator.plan import TrafficSpec, default_customers, plan_traffic
from devtools.simulator.report import SimulationReport, compare
from devtools.simulator.scenarios import INTENDED, Kind
from devtools.simulator.send import Delivery
from devtools.simulator.simulation import SimulationConfig, simulate
from metering.policy import CONFIRMED, HELD_FOR_REVIEW, PolicyConfig
from metering.pricing import PriceCatalog
from tests.helpers.catalog import TEST_CATALOG, stable_prices

CATALOG = PriceCatalog.from_prices(stable_prices())
ANCHOR = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def spec(seed: int, runs: int = 500, *, anchor: datetime = ANCHOR) -> TrafficSpec:
    prefix = f"sim{seed}-{anchor:%Y%m%dT%H%M%S}"
    return TrafficSpec(
        seed=seed,
        runs=runs,
        customers=default_customers(10, prefix),
        anchor=anchor,
        run_prefix=prefix,
    )


def test_same_seed_gives_the_same_events_and_another_seed_other_ones():
    first = plan_traffic(spec(7), CATALOG, PolicyConfig())
    again = plan_traffic(spec(7), CATALOG, PolicyConfig())
    other = plan_traffic(spec(8), CATALOG, PolicyConfig())
    events = [event for run in first for event in run.events]
    assert events == [event for run in again for event in run.events]
    assert [run.expected for run in first] == [run.expected for run in again]
    assert len({event["id"] for event in events}) == len(events)
    assert [run.scenario.calls for run in other] != [run.scenario.calls for run in first]


def test_generated_kinds_get_their_outcome_by_construction_and_by_the_policy():
    planned = plan_traffic(spec(7), CATALOG, PolicyConfig())
    assert {run.scenario.kind for run in planned} == set(Kind)
    for run in planned:
        assert run.expected.outcome == INTENDED[run.scenario.kind], run.run_id
        assert all(event["time"] <= "2026-11-30T11:55:00.000000Z" for event in run.events)


def test_a_run_settled_otherwise_is_a_mismatch_and_fails_the_simulation():
    planned = plan_traffic(spec(7, runs=30), CATALOG, PolicyConfig())
    actual = {
        run.run_id: {**asdict(run.expected), "rule_ids": list(run.expected.rule_ids)}
        | {"settled": True, "reopened": False}
        for run in planned
    }
    assert compare(planned, actual) == []
    wrong = next(run for run in planned if run.expected.outcome == CONFIRMED)
    missing = planned[-1]
    actual[wrong.run_id] |= {"outcome": HELD_FOR_REVIEW, "rule_ids": ["R7"]}
    del actual[missing.run_id]
    report = SimulationReport(planned, actual, Delivery(), compare(planned, actual))
    assert [(m.run, m.fields) for m in report.mismatches] == [
        (wrong, ("outcome", "rule_ids")),
        (missing, ("settled",)),
    ]
    assert report.exit_code == 1
    assert f"  {wrong.run_id} ({wrong.scenario.kind.value}" in report.render()


def test_cli_settles_now_and_a_rerun_with_the_same_seed_and_anchor_is_all_duplicates(
    live_server, make_key
):
    ingest, support = make_key(tenant="sim-cli"), make_key(tenant="sim-cli", scope="support")
    anchor = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S")
    args = ["simulate", "--runs", "40", "--customers", "4", "--seed", "3", "--no-progress"]
    args += ["--anchor", anchor, "--api", live_server, "--timeout", "60"]
    args += ["--key", ingest, "--support-key", support, "--settle-now"]
    args += ["--prices", str(TEST_CATALOG)]
    first = CliRunner().invoke(main, args)
    assert first.exit_code == 0, first.output
    assert "0 mismatch(es)." in first.output
    assert f"{'total':<22}{40:>10}{40:>10}{40:>10}" in first.output
    sent = re.search(r"^(\d+) events sent: \1 accepted, 0 duplicates", first.output, re.M)
    assert sent, first.output

    again = CliRunner().invoke(main, args)
    assert again.exit_code == 0, again.output
    assert f"{sent[1]} events sent: 0 accepted, {sent[1]} duplicates, 0 refused" in again.output


def test_real_worker_settles_500_simulated_runs_as_expected_and_the_ledger_reconciles(
    settling_worker, live_server, make_key, db
):
    traffic = spec(7, anchor=datetime.now(UTC).replace(microsecond=0))
    config = SimulationConfig(
        spec=traffic,
        api_url=live_server,
        key=make_key(tenant="sim"),
        progress=False,
        prices=stable_prices(),
    )
    report = simulate(config)

    assert report.ok, report.render()
    assert report.delivery.accepted == sum(len(run.events) for run in report.planned)
    expected = report.expected_totals()
    assert report.actual_totals() == expected
    assert {run.expected.outcome for run in report.planned} >= {HELD_FOR_REVIEW}
    ledger = db.execute(
        "SELECT coalesce(sum(amount_micros) FILTER (WHERE kind = 'hold'), 0), "
        "coalesce(sum(amount_micros) FILTER (WHERE kind = 'post' OR corrects = 'billed'), 0), "
        "coalesce(sum(amount_micros) FILTER (WHERE kind = 'release' OR corrects = 'credited'), 0)"
        " FROM ledger_entries WHERE tenant_id = 'sim'"
    ).fetchone()
    held = db.execute(
        "SELECT coalesce(sum(gross_micros), 0) FROM runs "
        "WHERE tenant_id = 'sim' AND outcome = 'held_for_review'"
    ).fetchone()[0]
    assert ledger == (expected.gross_micros, expected.billed_micros, expected.credited_micros)
    assert held == expected.held_micros
    assert expected.gross_micros == sum(ledger[1:]) + held
