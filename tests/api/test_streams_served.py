"""Live status streams on served API processes: notifications committed by anyone reach
streams on every process, resume without loss, stay with their tenant and customer, and
survive a lost listener; heartbeats flow, a hung-up client frees its place, and a shutdown
does not wait for streams that never end.

Notifications are committed with ``record`` from the test's own connection, exactly as a
worker or another API process commits them (the change points themselves are issue #16's
emitting part); one test goes through real ingest.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from prometheus_client.mmap_dict import MmapedDict

from api.stream_hub import APPLICATION_NAME
from metering.db import raw_transaction
from metering.notifications import Notification, record, record_many
from tests.api.conftest import STREAM_ENV
from tests.helpers.events import STRUCTURED, auth, event
from tests.helpers.ingest import ingest
from tests.helpers.processes import wait_until
from tests.helpers.sse import StreamReader
from tests.security.harness import Served, serve

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def runs(engine: Any, settings: Any, db: psycopg.Connection[Any]) -> None:
    """acme: run-a of cust-a, run-b of cust-b; globex: run-g of its own customer cust-a."""
    ingest(engine, settings, [event(type="run.started", run="run-a", customer="cust-a")])
    ingest(engine, settings, [event(type="run.started", run="run-b", customer="cust-b")])
    ingest(
        engine,
        settings,
        [event(type="run.started", run="run-g", customer="cust-a")],
        tenant="globex",
    )


def notify(engine: Any, subject: str, status: str, *, tenant: str = "acme") -> int:
    """Commit one ``run.status_changed`` about ``subject``, from a connection of our own."""
    with raw_transaction(engine) as conn:
        run_id, customer = conn.execute(
            "SELECT id, customer_id FROM runs WHERE tenant_id = %s AND subject = %s",
            (tenant, subject),
        ).fetchone()
        return record(
            conn,
            Notification(
                tenant, customer, "run.status_changed", {"status": status}, run_id, subject
            ),
        )


def stream(base: str, path: str, key: str, **headers: str) -> StreamReader:
    reader = StreamReader(f"{base}{path}", {**auth(key), **headers})
    assert reader.status == 200, f"{path}: {reader.status} {reader.body}"
    return reader


def opened(reader: StreamReader) -> Any:
    """The stream's first event (a fresh stream's run.status or stream.opened)."""
    first = reader.next(timeout_s=30)
    assert first.event in {"run.status", "stream.opened"}, first
    return first


def streams_open(base: str) -> float:
    text = httpx.get(f"{base}/metrics", timeout=10).text
    found = re.search(r"^fairmeter_streams_open (\S+)$", text, re.MULTILINE)
    assert found, "no fairmeter_streams_open in /metrics"
    return float(found.group(1))


def metric(api: Served, name: str) -> float:
    text = httpx.get(f"{api.base}/metrics", timeout=10).text
    found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def listeners(db: psycopg.Connection[Any], api: Served) -> list[int]:
    """Backend pids of the process's listening connections."""
    assert api.process is not None
    rows = db.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name = %s "
        "AND datname = current_database()",
        (f"{APPLICATION_NAME} {api.process.pid}",),
    ).fetchall()
    return [int(r[0]) for r in rows]


@pytest.mark.usefixtures("runs")
def test_a_commit_from_a_third_connection_reaches_streams_on_both_processes_within_a_second(
    stream_apis, engine, make_key
):
    first, second = stream_apis
    key = make_key(tenant="acme", scope="customer", customer="cust-a")
    with (
        stream(first.base, "/v1/runs/run-a/stream", key) as on_first,
        stream(second.base, "/v1/customers/cust-a/stream", key) as on_second,
    ):
        opened(on_first), opened(on_second)
        for step in range(3):
            committing = time.monotonic()
            nid = notify(engine, "run-a", f"step {step}")
            for reader in (on_first, on_second):
                [block] = reader.events(1, timeout_s=10)
                assert (block.id, block.event) == (nid, "run.status_changed")
                assert block.data["data"] == {"status": f"step {step}"}
                assert (block.data["run"], block.data["customer"]) == ("run-a", "cust-a")
                assert block.arrived - committing < 1.0, f"{block.arrived - committing:.3f}s"


@pytest.mark.usefixtures("runs")
def test_streams_on_every_worker_of_a_multi_worker_api_get_each_commit(
    live_server, engine, make_key
):
    """``fairmeter serve --workers 2``: each worker is a process with its own listener."""
    key = make_key(tenant="acme", scope="support")
    readers = [stream(live_server, "/v1/runs/run-a/stream", key) for _ in "abcd"]
    try:
        for reader in readers:
            opened(reader)
        assert streams_open(live_server) == 4  # summed over the workers
        committing = time.monotonic()
        nid = notify(engine, "run-a", "to everyone")
        for reader in readers:
            [block] = reader.events(1, timeout_s=10)
            assert block.id == nid and block.arrived - committing < 1.0
    finally:
        for reader in readers:
            reader.close()
    assert wait_until(lambda: streams_open(live_server) == 0, 15)


@pytest.mark.usefixtures("runs")
def test_a_client_resuming_with_last_event_id_gets_what_committed_meanwhile_once_in_order(
    stream_apis, engine, make_key
):
    first, second = stream_apis
    key = make_key(tenant="acme", scope="customer", customer="cust-a")
    with stream(first.base, "/v1/runs/run-a/stream", key) as before:
        opened(before)
        seen = [notify(engine, "run-a", f"seen {i}") for i in range(2)]
        assert [b.id for b in before.events(2)] == seen
    missed = [notify(engine, "run-a", f"missed {i}") for i in range(5)]
    # The reconnection lands on the other process, as behind a load balancer.
    with stream(second.base, "/v1/runs/run-a/stream", key, **{"Last-Event-ID": str(seen[-1])}) as r:
        replayed = r.events(5)
        assert [b.id for b in replayed] == missed
        assert [b.data["data"]["status"] for b in replayed] == [f"missed {i}" for i in range(5)]
        live = notify(engine, "run-a", "live")
        assert [b.id for b in r.events(1)] == [live]
        assert r.quiet_for(1.5) == [], "something was sent twice"


@pytest.mark.usefixtures("runs")
def test_a_notification_committing_after_a_higher_one_while_the_client_is_away_arrives_on_resume(
    stream_apis, engine, database_url, make_key
):
    """Ids are handed out at insert, not at commit: the lower one can commit second. A client
    that resumed from the highest id it saw would never get it; the resume token lists what
    was sent above its floor, so the resumed stream sends it, once."""
    first, second = stream_apis
    key = make_key(tenant="acme", scope="customer", customer="cust-a")
    with raw_transaction(engine) as run_ids:
        run_id = run_ids.execute("SELECT id FROM runs WHERE subject = 'run-a'").fetchone()[0]
    slow = psycopg.connect(database_url)
    try:
        with stream(first.base, "/v1/customers/cust-a/stream", key) as before:
            opened(before)
            with slow.transaction():
                late = record(
                    slow,
                    Notification(
                        "acme", "cust-a", "run.status_changed", {"n": "late"}, run_id, "run-a"
                    ),
                )
                higher = notify(engine, "run-a", "committed first")
                [block] = before.events(1)
                assert block.id == higher > late
                token = block.token
                before.close()  # the client drops; the lower id commits while it is away
        with stream(
            second.base, "/v1/customers/cust-a/stream", key, **{"Last-Event-ID": token}
        ) as r:
            assert [b.id for b in r.events(1)] == [late]
            assert r.quiet_for(1.5) == [], "something was sent twice"
    finally:
        slow.close()


@pytest.mark.usefixtures("runs")
def test_a_customer_key_follows_only_its_own_customer_of_its_own_tenant(
    stream_apis, engine, make_key
):
    first, _ = stream_apis
    key = make_key(tenant="acme", scope="customer", customer="cust-a")
    for path in ("/v1/customers/cust-b/stream", "/v1/runs/run-b/stream"):
        refused = StreamReader(f"{first.base}{path}", auth(key))
        assert refused.status == 404, (path, refused.status, refused.body)
    with stream(first.base, "/v1/customers/cust-a/stream", key) as mine:
        opened(mine)
        notify(engine, "run-b", "another customer's")
        notify(engine, "run-g", "another tenant's customer of the same name", tenant="globex")
        own = notify(engine, "run-a", "mine")
        assert [b.id for b in mine.events(1)] == [own]
        assert mine.quiet_for(1.5) == []


@pytest.mark.usefixtures("runs")
def test_heartbeats_flow_and_a_client_that_hangs_up_frees_its_place(stream_apis, db, make_key):
    first, _ = stream_apis
    key = make_key(tenant="acme", scope="support")
    assert wait_until(lambda: streams_open(first.base) == 0, 30)
    with stream(first.base, "/v1/runs/run-a/stream", key) as reader:
        opened(reader)
        assert reader.next(timeout_s=3).keep_alive  # FAIRMETER_STREAM_HEARTBEAT_S=1
        assert reader.next(timeout_s=3).keep_alive
        assert streams_open(first.base) == 1
    assert wait_until(lambda: streams_open(first.base) == 0, 15), "the stream was not freed"
    assert len(listeners(db, first)) == 1  # the listener stays for the next stream


@pytest.mark.usefixtures("runs")
def test_a_killed_listener_connection_is_made_again_and_streams_lose_nothing(
    stream_apis, engine, db, make_key
):
    first, second = stream_apis
    key = make_key(tenant="acme", scope="support")
    with (
        stream(first.base, "/v1/runs/run-a/stream", key) as by_run,
        stream(first.base, "/v1/customers/cust-a/stream", key) as by_customer,
        stream(second.base, "/v1/runs/run-a/stream", key) as elsewhere,
    ):
        for reader in (by_run, by_customer, elsewhere):
            opened(reader)
        [old] = listeners(db, first)  # one per process, however many streams it serves
        assert len(listeners(db, second)) == 1
        db.execute("SELECT pg_terminate_backend(%s)", (old,))
        during = [notify(engine, "run-a", f"while reconnecting {i}") for i in range(3)]
        for reader in (by_run, by_customer, elsewhere):
            assert [b.id for b in reader.events(3, timeout_s=15)] == during
        assert wait_until(lambda: len(listeners(db, first)) == 1, 15)
        assert listeners(db, first) != [old]
        committing = time.monotonic()
        after = notify(engine, "run-a", "after")
        for reader in (by_run, by_customer, elsewhere):
            [block] = reader.events(1, timeout_s=10)
            assert block.id == after and block.arrived - committing < 1.0
            assert reader.quiet_for(0.5) == []
    assert metric(first, "fairmeter_stream_listener_reconnects_total") >= 1


@pytest.mark.usefixtures("runs")
def test_a_client_behind_by_more_than_its_inbox_catches_up_from_the_table(
    stream_apis, engine, make_key
):
    _, second = stream_apis  # keeps 4 notifications per client in memory
    key = make_key(tenant="acme", scope="customer", customer="cust-a")
    catch_ups = metric(second, "fairmeter_stream_catch_ups_total")
    with stream(second.base, "/v1/customers/cust-a/stream", key) as reader:
        opened(reader)
        with raw_transaction(engine) as conn:
            run_id = conn.execute("SELECT id FROM runs WHERE subject = 'run-a'").fetchone()[0]
            burst = record_many(
                conn,
                [
                    Notification("acme", "cust-a", "run.status_changed", {"n": i}, run_id, "run-a")
                    for i in range(50)
                ],
            )
        got = reader.events(50, timeout_s=30)
        assert [b.id for b in got] == burst
        assert [b.data["data"]["n"] for b in got] == list(range(50))
        assert reader.quiet_for(1.0) == []
    assert metric(second, "fairmeter_stream_catch_ups_total") > catch_ups


@pytest.mark.usefixtures("runs")
def test_a_connection_lost_ingested_on_one_process_reaches_a_stream_on_the_other(
    stream_apis, make_key
):
    first, second = stream_apis
    reader_key = make_key(tenant="acme", scope="customer", customer="cust-a")
    ingest_key = make_key(tenant="acme", scope="ingest")
    with stream(first.base, "/v1/runs/run-a/stream", reader_key) as reader:
        assert opened(reader).data["data"]["status"] == "Agent still running"
        lost = event(type="connection.lost", run="run-a", customer="cust-a", side="server")
        reply = httpx.post(
            f"{second.base}/v1/events",
            content=json.dumps(lost),
            headers=auth(ingest_key, **STRUCTURED),
            timeout=30,
        )
        assert reply.status_code == 200, reply.text
        changes = [b for b in reader.quiet_for(5.0) if b.event == "run.status_changed"]
        assert [b.data["data"]["status"] for b in changes] == ["Connection interrupted"]


@pytest.mark.usefixtures("runs")
def test_a_shutdown_cuts_open_streams_after_its_grace_instead_of_waiting_for_them(
    settings, tmp_path, make_key
):
    key = make_key(tenant="acme", scope="support")
    with serve(settings, tmp_path, **STREAM_ENV) as api:  # FAIRMETER_SHUTDOWN_GRACE_S=2
        assert api.process is not None
        reader = stream(api.base, "/v1/runs/run-a/stream", key)
        opened(reader)
        stopping = time.monotonic()
        api.process.terminate()
        api.process.wait(timeout=60)
        assert time.monotonic() - stopping < 10
        reader.close()


def open_streams_by_process(metrics_dir: Path) -> dict[int, float]:
    """The open-streams gauge as each worker wrote it in the multi-process directory."""
    found: dict[int, float] = {}
    for path in metrics_dir.glob("gauge_livesum_*.db"):
        pid = int(path.stem.rsplit("_", 1)[1])
        for key, value, *_ in MmapedDict.read_all_values_from_file(str(path)):
            if json.loads(key)[0] == "fairmeter_streams_open":
                found[pid] = found.get(pid, 0.0) + value
    return found


@pytest.mark.usefixtures("runs")
def test_a_sigkilled_api_worker_leaves_none_of_its_streams_in_the_open_streams_gauge(
    settings, make_key, tmp_path
):
    """``fairmeter serve --workers 2``, streams open on its workers, one worker SIGKILLed:
    nothing of it decrements its share of the gauge, so the scrape must stop counting a
    dead process's share (uvicorn starts a new worker meanwhile)."""
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    key = make_key(tenant="acme", scope="support")
    with serve(
        settings, tmp_path, workers=2, PROMETHEUS_MULTIPROC_DIR=str(metrics_dir), **STREAM_ENV
    ) as api:
        readers = [stream(api.base, "/v1/runs/run-a/stream", key) for _ in range(6)]
        try:
            for reader in readers:
                opened(reader)
            assert streams_open(api.base) == 6
            held = {pid: n for pid, n in open_streams_by_process(metrics_dir).items() if n}
            assert sum(held.values()) == 6
            victim = max(held, key=lambda pid: held[pid])
            os.kill(victim, signal.SIGKILL)
            left = 6 - held[victim]
            assert wait_until(lambda: streams_open(api.base) == left, 30), streams_open(api.base)
            time.sleep(1.5)
            assert streams_open(api.base) == left  # and it stays there
        finally:
            for reader in readers:
                reader.close()
        assert wait_until(lambda: streams_open(api.base) == 0, 15), streams_open(api.base)
