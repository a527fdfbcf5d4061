"""The bulk run reader the webhook fan-out uses shows each run exactly as ``get_run_view``
(and so ``GET /v1/runs/{run}``) does: settled, re-settled, held and still-running runs read
together in one call."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from metering.db import raw_transaction
from metering.keys import Principal, Scope
from metering.runs import get_run_view, run_document, run_views
from metering.settlement.settle import settle_runs
from tests.helpers.events import usage
from tests.helpers.ingest import ingest
from tests.helpers.scenarios import KINDS, scenario

NOW = datetime.now(UTC)
START = NOW - timedelta(hours=1)
ADMIN = Principal("acme", Scope.ADMIN, "k-test")


def test_many_runs_read_at_once_are_the_runs_each_read_alone(engine, settings, db):
    for n, kind in enumerate(KINDS):
        ingest(engine, settings, scenario(kind, f"settled-{n}", "c1", START))
    ids: dict[str, int] = dict(db.execute("SELECT subject, id FROM runs").fetchall())
    with raw_transaction(engine) as conn:
        settle_runs(conn, list(ids.values()), now=NOW, settings=settings)
    # A late usage line re-opens one settled run; another run is still going.
    ingest(engine, settings, [usage(run="settled-0", customer="c1", step=99)])
    ingest(engine, settings, [usage(run="live", customer="c2", step=1)])
    ids = dict(db.execute("SELECT subject, id FROM runs").fetchall())
    with raw_transaction(engine) as conn:
        together = run_views(conn, [*ids.values(), ids["live"], 10**12])
        alone: dict[str, Any] = {s: get_run_view(conn, ADMIN, s) for s in ids}
    assert set(together) == set(ids.values())  # no run for an unknown id, none twice
    for subject, run_id in ids.items():
        assert run_document(together[run_id]) == run_document(alone[subject]), subject
    # The cases meant are there: decided runs, a re-opened one, one never settled.
    assert together[ids["settled-1"]].settled and together[ids["settled-1"]].decisions
    assert together[ids["settled-0"]].reopened
    assert not together[ids["live"]].decisions
