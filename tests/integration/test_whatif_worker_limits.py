"""A what-if's worker processes never outlive the request that started them: they run under
its ``statement_timeout``, and a cancelled what-if terminates their backends
(metering/settlement/replay_shards.py). A worker is held by a lock the test takes on
``decisions``, which only the replay reads, so nothing depends on the machine's speed."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

from metering.db import StatementLimits, bounded_transaction
from metering.policies.defaults import settings_policy
from metering.settlement.replay_shards import (
    WORKER_APPLICATION,
    Parallelism,
    replay_period_parallel,
)
from tests.api.heavy_harness import PROMPT_S, locked
from tests.helpers.processes import wait_until

LOCK_DECISIONS = "LOCK TABLE decisions IN ACCESS EXCLUSIVE MODE"


def offloaded(settings: Any) -> Parallelism:
    return Parallelism(settings.libpq_url(), processes=2, offload=True, nice=1)


def workers(db: psycopg.Connection[Any]) -> int:
    row = db.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND application_name LIKE %s",
        (f"{WORKER_APPLICATION}%",),
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_worker_runs_under_the_requests_statement_timeout(engine, settings, db):
    defaults = settings_policy(settings)
    limits = StatementLimits(statement_timeout_s=1, lock_timeout_s=PROMPT_S * 4)
    with (
        locked(settings, LOCK_DECISIONS),
        pytest.raises(psycopg.errors.QueryCanceled, match="statement timeout"),
        bounded_transaction(engine, limits) as conn,
    ):
        replay_period_parallel(conn, "acme", "2026-01", defaults, defaults, offloaded(settings))
    assert wait_until(lambda: workers(db) == 0, PROMPT_S), "a worker replays for nobody"


def test_a_cancelled_what_if_terminates_its_workers_backends(engine, settings, db):
    defaults = settings_policy(settings)
    limits = StatementLimits(statement_timeout_s=PROMPT_S * 4, lock_timeout_s=PROMPT_S * 4)
    cancel = threading.Event()
    with locked(settings, LOCK_DECISIONS):
        canceller = threading.Thread(
            target=lambda: wait_until(lambda: workers(db) > 0, PROMPT_S) and cancel.set()
        )
        canceller.start()
        with (
            pytest.raises(psycopg.errors.QueryCanceled),
            bounded_transaction(engine, limits) as conn,
        ):
            replay_period_parallel(
                conn, "acme", "2026-01", defaults, defaults, offloaded(settings), cancel.is_set
            )
        canceller.join()
        assert cancel.is_set(), "no worker replayed the what-if"
        assert wait_until(lambda: workers(db) == 0, PROMPT_S), "a worker replays for nobody"
