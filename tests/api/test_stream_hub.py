"""The process's fan-out (api/stream_hub.py) on the real database, without HTTP: what an
inbox is offered, when it must catch up from the table instead, and how many streams a
process, a tenant and a key may hold."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from anyio import to_thread

from api.stream_hub import Inbox, StreamHub
from metering.db import raw_transaction
from metering.errors import MeteringError
from metering.notifications import Notification, record
from metering.notifications.replay import StoredNotification, StreamScope
from tests.helpers.aio import run_in_fresh_loop
from tests.helpers.events import event
from tests.helpers.ingest import ingest

pytestmark = pytest.mark.timeout(120)


AT = datetime(2026, 12, 1, tzinfo=UTC)


def row(nid: int) -> StoredNotification:
    return StoredNotification(nid, "acme", "c1", None, None, "run.status_changed", {}, AT)


def test_an_inbox_that_overflows_forgets_its_rows_and_says_it_is_behind():
    async def main() -> None:
        inbox = Inbox(StreamScope("acme", "c1"), "key", max_items=2)
        inbox.offer(row(1))
        inbox.offer(row(2))
        assert inbox.take() == ([row(1), row(2)], False)
        for nid in range(3, 6):
            inbox.offer(row(nid))
        assert await inbox.wait(0)
        assert inbox.take() == ([], True)  # 3 and 4 were dropped with 5: read them back
        assert not await inbox.wait(0)

    run_in_fresh_loop(main)


def test_a_process_and_a_key_hold_at_most_their_share_of_streams(settings, engine, db):
    async def main() -> None:
        hub = StreamHub(
            settings.model_copy(update={"stream_max_per_process": 3, "stream_max_per_key": 2}),
            engine,
        )
        scope = StreamScope("acme", "c1")
        try:
            first = hub.subscribe(scope, "key-a")
            hub.subscribe(scope, "key-a")
            with pytest.raises(MeteringError) as per_key:
                hub.subscribe(scope, "key-a")
            assert (per_key.value.status, per_key.value.code) == (429, "too_many_streams")
            hub.subscribe(scope, "key-b")  # another key is not held back by key-a
            with pytest.raises(MeteringError) as per_process:
                hub.subscribe(scope, "key-c")
            assert (per_process.value.status, per_process.value.code) == (503, "too_many_streams")
            hub.unsubscribe(first)
            hub.unsubscribe(first)  # twice is harmless
            assert (hub.open, hub.held_by("key-a")) == (2, 1)
            hub.subscribe(scope, "key-a")
        finally:
            await hub.close()

    run_in_fresh_loop(main)


def test_a_tenant_at_its_share_is_told_so_with_a_429_even_when_the_process_is_full(
    settings, engine, db
):
    async def main() -> None:
        caps = {"stream_max_per_process": 3, "stream_max_per_tenant": 2, "stream_max_per_key": 1}
        hub = StreamHub(settings.model_copy(update=caps), engine)
        acme, globex = StreamScope("acme", "c1"), StreamScope("globex", "c1")
        try:
            first = hub.subscribe(acme, "acme-1")
            hub.subscribe(acme, "acme-2")
            hub.subscribe(globex, "globex-1")  # the process is full now
            with pytest.raises(MeteringError) as over_share:  # its own doing, process aside
                hub.subscribe(acme, "acme-3")
            assert (over_share.value.status, over_share.value.code) == (
                429,
                "too_many_streams_for_tenant",
            )
            assert over_share.value.extra == {"retry_after_s": 5, "limit": 2}
            with pytest.raises(MeteringError) as full:  # within its share: the process is full
                hub.subscribe(globex, "globex-2")
            assert (full.value.status, full.value.code) == (503, "too_many_streams")
            hub.unsubscribe(first)
            assert (hub.open, hub.held_by_tenant("acme"), hub.held_by_tenant("globex")) == (2, 1, 1)
            hub.subscribe(globex, "globex-2")  # room again, for whoever is within its share
        finally:
            await hub.close()

    run_in_fresh_loop(main)


def test_the_hub_offers_each_inbox_the_committed_notifications_it_shows(
    settings, engine, db: psycopg.Connection[Any]
):
    ingest(engine, settings, [event(type="run.started", run="r1", customer="c1")])
    ingest(engine, settings, [event(type="run.started", run="r2", customer="c1")])
    ingest(engine, settings, [event(type="run.started", run="r3", customer="c2")])
    runs = dict(db.execute("SELECT subject, id FROM runs").fetchall())

    def commit(subject: str, customer: str) -> int:
        with raw_transaction(engine) as conn:
            return record(
                conn,
                Notification("acme", customer, "run.status_changed", {}, runs[subject], subject),
            )

    async def main() -> None:
        hub = StreamHub(settings, engine)
        by_run = hub.subscribe(StreamScope("acme", "c1", runs["r1"], "r1"), "key")
        by_customer = hub.subscribe(StreamScope("acme", "c1"), "key")
        try:
            # Once listening, every inbox is told to read the table: commits before that
            # were announced to nobody.
            for inbox in (by_run, by_customer):
                assert await inbox.wait(30)
                assert inbox.take() == ([], True)
            ids = [
                await to_thread.run_sync(commit, subject, customer)
                for subject, customer in (("r1", "c1"), ("r2", "c1"), ("r3", "c2"))
            ]
            await asyncio.sleep(1.0)
            assert [r.id for r in by_run.take()[0]] == ids[:1]
            assert [r.id for r in by_customer.take()[0]] == ids[:2]
        finally:
            await hub.close()

    run_in_fresh_loop(main)
