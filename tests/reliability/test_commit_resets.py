"""Issue #8 item 5: the connection to PostgreSQL is reset right after a COMMIT.

The API and the worker reach PostgreSQL through a proxy that, for chosen transactions,
lets the COMMIT happen and then resets the client's connection, with or without passing
the server's "COMMIT" on. The caller sees its commit fail although it took effect, and
retries: the client resends the batch (the server answers "duplicate"), the worker
settles the chunk's runs again one by one (each is found already decided: no version 2).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit, urlunsplit

from fairmeter_client import Meter

from tests.helpers.processes import wait_until
from tests.reliability.books import Workload, all_settled, check_books, settled_runs
from tests.reliability.pgproxy import CommitResetProxy, ResetPolicy
from tests.reliability.spooled import report

START = datetime.now(UTC) - timedelta(minutes=30)
SOURCE = "agent-backend/commit-reset"
INGEST = SOURCE.encode()  # in every ingest transaction's bound parameters
SETTLEMENT = b"COPY decisions"  # in every settlement transaction that decides runs


def through(url: str, port: int) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{parts.username}@127.0.0.1:{port}"))


def test_commits_reset_on_the_wire_are_retried_as_duplicates_and_no_new_versions(
    settings, db, make_key, private_redis, stack, tmp_path
):
    parts = urlsplit(settings.database_url)
    upstream = (parts.hostname or "127.0.0.1", parts.port or 5432)
    policy = ResetPolicy(limits={INGEST: 2, SETTLEMENT: 3})
    workload = Workload.make(200, 20, START, prefix="reset")
    key = make_key()
    with CommitResetProxy(upstream, policy) as proxy:
        proxied = settings.model_copy(
            update={"database_url": through(settings.database_url, proxy.port)}
        )
        env = stack.env(proxied, private_redis.url(), FAIRMETER_SETTLE_CHUNK_SIZE="20")
        api = stack.api(env)
        stack.worker(env)
        stack.beat(env)
        with Meter(
            api,
            key,
            source=SOURCE,
            spool_path=tmp_path / "spool.db",
            max_batch_events=50,
            backoff_base_s=0.05,
            max_backoff_s=0.5,
        ) as meter:
            sent = report(meter, workload)
            assert meter.flush(timeout=60), meter.stats()
            stats = meter.stats()
        assert wait_until(lambda: all_settled(db, 200), timeout_s=90), f"{settled_runs(db)}/200"
    log = stack.log("worker")
    # A chunk whose commit failed is settled again run by run; a one-run chunk's task fails
    # and its run waits for the sweep (it was decided: nothing is left to do).
    retried_chunks = log.count("settling its runs one by one")
    print(
        f"\n[faults] commit resets: {policy.resets}; client {stats}; "
        f"chunks retried run by run: {retried_chunks}"
    )
    assert policy.count(INGEST, "drop") and policy.count(INGEST, "forward"), policy.resets
    assert policy.count(SETTLEMENT) >= 2, policy.resets
    assert stats.duplicates > 0 and stats.dead_letters == 0, stats
    assert stats.accepted + stats.duplicates == len(sent.events)  # each accepted once
    assert retried_chunks >= 1
    check_books(db, sent)
