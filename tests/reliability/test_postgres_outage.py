"""Issue #8 item 4: PostgreSQL frozen (SIGSTOP, 10 s) and stopped with ``-m immediate``,
each while the worker is settling, on a private cluster (others share the machine's).

Settlement of a chunk is one transaction, so a crash leaves it whole or absent, never half
written; ingest answers 503 with ``Retry-After`` while the database is down, and the
client's spool keeps the events until they are delivered, once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from fairmeter_client import Meter

from metering.config import Settings
from metering.db import create_db_engine, raw_transaction
from metering.keys import Scope
from metering.keys_repo import create_key
from tests.helpers.database import TEST_PEPPER
from tests.helpers.ingest import ingest
from tests.helpers.processes import wait_until
from tests.reliability.books import Workload, all_settled, check_books, settled_runs
from tests.reliability.load import HttpIngest
from tests.reliability.servers import PrivatePostgres, fairmeter_database
from tests.reliability.spooled import report

START = datetime.now(UTC) - timedelta(minutes=30)
FREEZE_S = 10.0
DOWN_S = 6.0


@pytest.fixture(scope="module")
def postgres() -> Iterator[PrivatePostgres]:
    """A cluster of this module's own: the session's private one must survive the crash."""
    server = PrivatePostgres()
    try:
        server.init()
        server.start()
        fairmeter_database(server)
        yield server
    finally:
        server.destroy()


def connect(server: PrivatePostgres) -> psycopg.Connection[Any]:
    return psycopg.connect(server.url("fairmeter"), autocommit=True)


def test_postgres_frozen_and_crashed_mid_settlement_leaves_whole_books_and_503s(
    postgres, private_redis, stack, tmp_path
):
    settings = Settings(
        database_url=postgres.url("fairmeter"),
        redis_url=private_redis.url(),
        key_pepper=TEST_PEPPER,
        log_json=False,
        log_level="WARNING",
    )
    engine = create_db_engine(settings)
    env = stack.env(settings, private_redis.url(), FAIRMETER_SETTLE_CHUNK_SIZE="50")
    api = stack.api(env)
    with raw_transaction(engine) as conn:
        _, key = create_key(conn, tenant_id="acme", scope=Scope.INGEST, pepper=TEST_PEPPER)
    stack.worker(env)
    stack.beat(env)
    frozen_wave = Workload.make(600, 60, START, prefix="frozen")
    crash_wave = Workload.make(600, 60, START, prefix="crash")
    probe_runs = Workload.make(30, 30, START, prefix="probe")
    probes = stack.ingest(api, key, probe_runs.batches(1), threads=1, timeout_s=30, pause_s=0.5)
    meter = Meter(
        api,
        key,
        source="agent-backend/pg-outage",
        spool_path=tmp_path / "spool.db",
        backoff_base_s=0.1,
        max_backoff_s=1.0,
        timeout_s=30.0,
    )
    db = connect(postgres)
    try:
        # Each wave is ingested in one transaction, so its settlement starts only once all of
        # it is in; a wave ingested batch by batch could settle whole while still ingesting
        # on a loaded machine, and the fault would then hit nothing.
        ingest(engine, settings, frozen_wave.events)
        assert wait_until(
            lambda: settled_runs(db, prefix="frozen-") > 0, timeout_s=60, interval_s=0.01
        )
        at_freeze = settled_runs(db, prefix="frozen-")
        postgres.freeze()
        try:
            probes.phase = "frozen"
            probes.start()
            spooled_frozen = report(meter, Workload.make(20, 20, START, prefix="spool-frozen"))
            time.sleep(FREEZE_S)
        finally:
            postgres.thaw()
        probes.phase = "after"

        ingest(engine, settings, crash_wave.events)
        assert wait_until(
            lambda: settled_runs(db, prefix="crash-") > 0, timeout_s=60, interval_s=0.01
        )
        at_crash = settled_runs(db, prefix="crash-")
        postgres.stop("immediate")
        # Counted per wave: the probes and the spooled runs settle meanwhile too (a total
        # of all runs read 1202 "past" 1200 with 552 of the crash wave's 600 settled).
        assert at_freeze < 600 and at_crash < 600, "a fault came after settlement was over"
        try:
            probes.phase = "down"
            spooled_down = report(meter, Workload.make(20, 20, START, prefix="spool-down"))
            assert meter.flush(timeout=DOWN_S) is False  # the API cannot take them now
        finally:
            postgres.start()
        probes.phase = "after"
        db.close()
        db = connect(postgres)

        assert meter.flush(timeout=60), meter.stats()
        assert probes.join(60), "a probe batch was never accepted"
        stats = meter.stats()
        assert (stats.pending_events, stats.dead_letters) == (0, 0), stats
        total = 1200 + 30 + 40
        assert wait_until(lambda: all_settled(db, total), timeout_s=90), settled_runs(db)
        check_statuses(probes)
        print(
            f"\n[faults] postgres: settled {at_freeze}/600 at the freeze, {at_crash}/600 of the "
            f"crash wave at the crash; probe replies "
            f"frozen {probes.statuses('frozen')} down {probes.statuses('down')} "
            f"after {probes.statuses('after')}; longest frozen wait "
            f"{max((a.seconds for a in probes.attempts if a.phase == 'frozen'), default=0):.1f}s"
            f"; client {stats}"
        )
        everything = [frozen_wave, crash_wave, spooled_frozen, spooled_down, probe_runs]
        check_books(db, combined(everything))
    finally:
        postgres.thaw()
        meter.close(timeout=1)
        db.close()
        engine.dispose()


def combined(workloads: list[Workload]) -> Workload:
    kinds: dict[str, str] = {}
    events: list[dict[str, Any]] = []
    for workload in workloads:
        kinds.update(workload.kinds)
        events += workload.events
    return Workload(kinds, events)


def check_statuses(probes: HttpIngest) -> None:
    """Never a 500; 503 with Retry-After while the database is down."""
    assert all(a.status in (200, 503) for a in probes.attempts), probes.statuses()
    assert all(a.retry_after for a in probes.attempts if a.status == 503)
    assert 503 in probes.statuses("down"), probes.statuses()
