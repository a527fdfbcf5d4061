"""The client against the real API and PostgreSQL: outages, crashes, rejections, threads."""

from __future__ import annotations

import shutil
import signal
import threading
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from fairmeter_client import Meter, MeterConfigError, event_id

from tests.client.harness import (
    FAST_RETRIES,
    MODEL,
    SOURCE,
    read_json_line,
    start_snippet,
    stored_events,
)
from tests.helpers.events import STRUCTURED, auth, event
from tests.helpers.processes import free_port


def report_usage(run, steps, **tokens):
    return [
        run.usage(step=s, model=MODEL, input_tokens=100 * s, output_tokens=10, **tokens)
        for s in steps
    ]


def test_events_reported_while_the_api_is_down_arrive_once_in_spool_order(
    api_process, make_key, db, spool_path
):
    key = make_key()
    api_process.start()
    meter = Meter(
        api_process.base_url,
        key,
        source=SOURCE,
        spool_path=spool_path,
        max_batch_events=3,  # several requests, so their order is visible server-side
        **FAST_RETRIES,
    )
    try:
        run = meter.run("run-outage", customer="cust-1")
        ids = [run.started(), *report_usage(run, [1])]
        assert meter.flush(timeout=10)

        api_process.stop()
        ids.append(run.connection_lost(side="server", reason="api deploy"))
        ids += report_usage(run, range(2, 8))
        ids += [run.checkpoint(checkpoint_id="ck-7", step=7), run.delivered(step=7)]
        ids.append(run.completed())
        assert meter.flush(timeout=1.0) is False
        assert meter.stats().pending_events == len(ids) - 2

        api_process.start()
        assert meter.flush(timeout=20)
        stats = meter.stats()
    finally:
        meter.close(timeout=1)

    assert db.execute("SELECT count(*) FROM events").fetchone() == (len(ids),)
    assert (stats.pending_events, stats.dead_letters, stats.accepted) == (0, 0, len(ids))
    received = {event_id: at for event_id, at, _ in stored_events(db)}
    in_spool_order = [received[i] for i in ids]
    assert in_spool_order == sorted(in_spool_order)
    assert len(set(in_spool_order)) >= len(ids) // 3  # one arrival time per batch


KILLED_WRITER = """
    import json, sys, time
    from fairmeter_client import Meter
    meter = Meter(sys.argv[1], sys.argv[2], source=sys.argv[3], spool_path=sys.argv[4],
                  backoff_base_s=0.05, max_backoff_s=0.2, timeout_s=1.0)
    run = meter.run("run-killed", customer="cust-1")
    ids = [run.started()]
    ids += [run.usage(step=s, model="agent-large-1", input_tokens=100, output_tokens=10)
            for s in range(1, 6)]
    ids.append(run.completed())
    print(json.dumps(ids), flush=True)
    time.sleep(60)  # killed long before
"""

NEXT_PROCESS = """
    import json, sys
    from fairmeter_client import Meter
    meter = Meter(sys.argv[1], sys.argv[2], source=sys.argv[3], spool_path=sys.argv[4])
    flushed = meter.flush(timeout=20)
    stats = meter.stats()
    meter.close(timeout=1)
    print(json.dumps({"flushed": flushed, "accepted": stats.accepted,
                      "duplicates": stats.duplicates, "pending": stats.pending_events}))
"""


def test_events_spooled_by_a_killed_process_are_delivered_once_by_the_next(
    live_server, make_key, db, spool_path
):
    key = make_key()
    nowhere = f"http://127.0.0.1:{free_port()}"  # nothing listens: every send fails
    writer = start_snippet(KILLED_WRITER, nowhere, key, SOURCE, str(spool_path))
    try:
        ids = read_json_line(writer)
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=10)
    finally:
        if writer.poll() is None:
            writer.kill()
    assert stored_events(db) == []

    reader = start_snippet(NEXT_PROCESS, live_server, key, SOURCE, str(spool_path))
    try:
        result = read_json_line(reader)
        reader.wait(timeout=10)
    finally:
        if reader.poll() is None:
            reader.kill()

    assert result == {"flushed": True, "accepted": 7, "duplicates": 0, "pending": 0}
    assert sorted(e[0] for e in stored_events(db)) == sorted(ids)
    assert db.execute("SELECT count(*) FROM events").fetchone() == (7,)


def test_rejected_event_is_dead_lettered_and_the_rest_of_its_batch_delivered(
    live_server, make_key, db, spool_path
):
    meter = Meter(live_server, make_key(), source=SOURCE, spool_path=spool_path, start=False)
    try:
        run = meter.run("run-bad-model", customer="cust-1")
        good = [run.started(), *report_usage(run, [1, 2])]
        bad = run.usage(step=3, model="no-such-model", input_tokens=1, output_tokens=1)
        good += [*report_usage(run, [4, 5]), run.completed()]
        meter.start()  # all eight go out as one batch
        assert meter.flush(timeout=10)
        letters = meter.dead_letters()
        stats = meter.stats()
    finally:
        meter.close(timeout=1)

    assert sorted(e[0] for e in stored_events(db)) == sorted(good)
    assert [letter.event_id for letter in letters] == [bad]
    assert letters[0].status == 422
    assert letters[0].code == "unknown_model"
    assert [e["code"] for e in letters[0].errors] == ["unknown_model"]
    assert letters[0].errors[0]["path"].endswith(".data.model")
    assert letters[0].event["data"]["model"] == "no-such-model"
    assert (stats.pending_events, stats.dead_letters) == (0, 1)


def test_id_taken_with_other_content_is_dead_lettered_as_a_conflict(
    live_server, make_key, db, spool_path
):
    key = make_key()
    taken = event_id("run-conflict", "run.started", 1, {})
    earlier = datetime.now(UTC) - timedelta(hours=1)
    squatter = event(type="run.started", run="run-conflict", id=taken, source=SOURCE, time=earlier)
    reply = httpx.post(
        f"{live_server}/v1/events", json=squatter, headers=auth(key, **STRUCTURED), timeout=10
    )
    assert reply.status_code == 200, reply.text

    meter = Meter(live_server, key, source=SOURCE, spool_path=spool_path, start=False)
    try:
        run = meter.run("run-conflict", customer="cust-1")
        assert run.started() == taken
        usage_ids = report_usage(run, [1, 2, 3])
        meter.start()
        assert meter.flush(timeout=10)
        letters = meter.dead_letters()
    finally:
        meter.close(timeout=1)

    assert [(letter.event_id, letter.status, letter.code) for letter in letters] == [
        (taken, 409, "event_conflict")
    ]
    assert sorted(e[0] for e in stored_events(db)) == sorted([taken, *usage_ids])


def test_repeated_calls_produce_one_event_server_side(live_server, make_key, db, spool_path):
    meter = Meter(live_server, make_key(), source=SOURCE, spool_path=spool_path)
    try:
        run = meter.run("run-repeat", customer="cust-1")
        first = run.usage(step=3, attempt=1, model=MODEL, input_tokens=500, output_tokens=50)
        again = run.usage(step=3, attempt=1, model=MODEL, input_tokens=500, output_tokens=50)
        assert meter.flush(timeout=10)
        after_delivery = run.usage(step=3, model=MODEL, input_tokens=500, output_tokens=50)
        assert meter.flush(timeout=10)
        stats = meter.stats()
    finally:
        meter.close(timeout=1)

    assert first == again == after_delivery
    assert [(e[0], e[2]) for e in stored_events(db)] == [(first, "run.usage")]
    assert (stats.accepted, stats.duplicates) == (1, 0)


def test_a_batch_resent_after_a_lost_reply_is_counted_once(live_server, make_key, db, tmp_path):
    key = make_key()
    spool, copy = tmp_path / "spool.db", tmp_path / "copy.db"
    writer = Meter(live_server, key, source=SOURCE, spool_path=spool, start=False)
    run = writer.run("run-resent", customer="cust-1")
    ids = [run.started(), *report_usage(run, [1, 2, 3]), run.completed()]
    writer.close(timeout=0)
    shutil.copy(spool, copy)  # as if the first delivery's reply never arrived

    stats = []
    for path in (spool, copy):
        meter = Meter(live_server, key, source=SOURCE, spool_path=path)
        try:
            assert meter.flush(timeout=10)
            stats.append(meter.stats())
        finally:
            meter.close(timeout=1)

    assert [(s.accepted, s.duplicates) for s in stats] == [(5, 0), (0, 5)]
    assert sorted(e[0] for e in stored_events(db)) == sorted(ids)


def test_the_same_fact_reported_from_two_hosts_with_its_time_is_counted_once(
    live_server, make_key, db, tmp_path
):
    key = make_key()
    happened = datetime.now(UTC) - timedelta(seconds=30)
    stats, ids = [], []
    for host in ("host-a", "host-b"):  # separate spools: neither knows the other's report
        meter = Meter(live_server, key, source=SOURCE, spool_path=tmp_path / f"{host}.db")
        try:
            run = meter.run("run-two-hosts", customer="cust-1")
            ids.append(run.usage(step=2, model=MODEL, input_tokens=5, output_tokens=5, at=happened))
            assert meter.flush(timeout=10)
            stats.append(meter.stats())
        finally:
            meter.close(timeout=1)

    assert ids[0] == ids[1]
    assert [(s.accepted, s.duplicates, s.dead_letters) for s in stats] == [(1, 0, 0), (0, 1, 0)]
    assert [e[0] for e in stored_events(db)] == [ids[0]]


def test_many_threads_reporting_at_once_lose_and_double_nothing(
    live_server, make_key, db, spool_path
):
    meter = Meter(live_server, make_key(), source=SOURCE, spool_path=spool_path)
    ids: list[str] = []
    failures: list[BaseException] = []
    lock = threading.Lock()

    def report(worker: int) -> None:
        try:
            run = meter.run(f"run-thread-{worker % 2}", customer="cust-1")
            mine = report_usage(run, range(worker * 100, worker * 100 + 20))
            mine += report_usage(run, [worker * 100])  # a retried call: same id
            mine += [run.heartbeat() for _ in range(5)]  # share one spool sequence per run
            with lock:
                ids.extend(mine)
        except BaseException as exc:
            with lock:
                failures.append(exc)

    threads = [threading.Thread(target=report, args=(n,)) for n in range(8)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert failures == []
        assert meter.flush(timeout=20)
    finally:
        meter.close(timeout=1)

    assert len(ids) == 8 * 26
    assert len(set(ids)) == 8 * 25
    assert sorted(e[0] for e in stored_events(db)) == sorted(set(ids))


def test_batches_too_large_for_the_server_are_split(live_server, make_key, db, spool_path):
    meter = Meter(
        live_server,
        make_key(),
        source=SOURCE,
        spool_path=spool_path,
        start=False,
        max_batch_events=1500,  # the server takes at most 1,000: 413
        synchronous="NORMAL",
    )
    try:
        run = meter.run("run-large", customer="cust-1")
        ids = [run.heartbeat() for _ in range(1200)]
        meter.start()
        assert meter.flush(timeout=20)
        stats = meter.stats()
    finally:
        meter.close(timeout=1)

    assert (stats.accepted, stats.dead_letters) == (1200, 0)
    assert db.execute("SELECT count(*) FROM events").fetchone() == (len(set(ids)),)


def test_a_refused_key_stops_sending_and_keeps_every_event(live_server, db, spool_path):
    meter = Meter(live_server, "fm_ingest_nope", source=SOURCE, spool_path=spool_path)
    try:
        run = meter.run("run-bad-key", customer="cust-1")
        ids = [run.started(), *report_usage(run, [1, 2])]
        with pytest.raises(MeterConfigError) as refused:
            meter.flush(timeout=10)
        stats = meter.stats()
    finally:
        meter.close(timeout=1)

    assert refused.value.status == 401
    assert (stats.pending_events, stats.dead_letters) == (len(ids), 0)
    assert stored_events(db) == []
