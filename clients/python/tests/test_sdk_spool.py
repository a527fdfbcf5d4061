"""The client on its own: stable ids, the spool's bounds and locks, no invented events."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from fairmeter_client import (
    EventConflictError,
    Meter,
    SpoolFullError,
    SpoolLockedError,
    event_id,
)

SDK_ROOT = Path(__file__).resolve().parents[1]
SOURCE = "agent-backend/client-test"
MODEL = "agent-large-1"
NOWHERE = "http://127.0.0.1:9"  # never contacted: these meters are not started


def offline_meter(spool_path, **options) -> Meter:
    return Meter(NOWHERE, "key", source=SOURCE, spool_path=spool_path, start=False, **options)


def test_client_imports_nothing_from_the_server_side():
    code = (
        "import sys, fairmeter_client; "
        "print(sorted({m.split('.')[0] for m in sys.modules} "
        "& {'litestar', 'sqlalchemy', 'sqlmodel', 'celery', 'metering', 'psycopg'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=SDK_ROOT, capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_ids_follow_the_natural_key_not_the_moment(tmp_path):
    first, second = offline_meter(tmp_path / "a.db"), offline_meter(tmp_path / "b.db")
    try:
        usage = {"step": 3, "model": MODEL, "input_tokens": 10, "output_tokens": 1}
        one = first.run("run-1", customer="cust-1")
        other = second.run("run-1", customer="cust-1")
        assert one.usage(**usage) == other.usage(**usage) == one.usage(**usage, attempt=1)
        assert one.usage(**usage) == event_id(
            "run-1", "run.usage", 1, {"step": 3, "tool_call_id": None, "replay": False}
        )
        assert one.usage(**usage, attempt=2) != one.usage(**usage)
        assert one.usage(**usage, replay=True) != one.usage(**usage)
        assert one.usage(**usage, tool_call_id="t1") != one.usage(**usage)
        assert one.usage(**usage, key="second call") != one.usage(**usage)
        assert one.checkpoint(checkpoint_id="ck", step=3) == other.checkpoint(
            checkpoint_id="ck", step=3
        )
    finally:
        first.close(timeout=0)
        second.close(timeout=0)


def test_same_key_with_other_content_is_refused_at_the_call(spool_path):
    meter = offline_meter(spool_path)
    try:
        run = meter.run("run-1", customer="cust-1")
        run.usage(step=1, model=MODEL, input_tokens=10, output_tokens=1)
        with pytest.raises(EventConflictError):
            run.usage(step=1, model=MODEL, input_tokens=99, output_tokens=1)
        assert meter.stats().pending_events == 1
    finally:
        meter.close(timeout=0)


def test_heartbeats_get_a_sequence_that_survives_a_restart(spool_path):
    seen = []
    for _ in range(2):
        meter = offline_meter(spool_path)
        try:
            run = meter.run("run-1", customer="cust-1")
            seen += [run.heartbeat(), run.heartbeat()]
        finally:
            meter.close(timeout=0)
    assert seen == [event_id("run-1", "run.heartbeat", 1, {"seq": n}) for n in (1, 2, 3, 4)]


def test_resumed_sets_the_attempt_of_later_events(spool_path):
    meter = offline_meter(spool_path)
    try:
        run = meter.run("run-1", customer="cust-1")
        run.resumed(attempt=2, from_checkpoint="ck-1")
        usage = {"step": 4, "model": MODEL, "input_tokens": 10, "output_tokens": 1}
        assert run.usage(**usage) == run.usage(**usage, attempt=2)
    finally:
        meter.close(timeout=0)


def test_a_full_spool_refuses_new_events_with_spool_full_error(tmp_path):
    by_count = offline_meter(tmp_path / "count.db", max_events=3)
    by_bytes = offline_meter(tmp_path / "bytes.db", max_spool_bytes=400)
    try:
        run = by_count.run("run-1", customer="cust-1")
        for step in (1, 2, 3):
            run.usage(step=step, model=MODEL, input_tokens=10, output_tokens=1)
        with pytest.raises(SpoolFullError, match="max_events=3"):
            run.usage(step=4, model=MODEL, input_tokens=10, output_tokens=1)
        assert by_count.stats().pending_events == 3

        run = by_bytes.run("run-1", customer="cust-1")
        run.started()
        with pytest.raises(SpoolFullError, match="max_spool_bytes=400"):
            run.completed()
        assert by_bytes.stats().pending_events == 1
    finally:
        by_count.close(timeout=0)
        by_bytes.close(timeout=0)


def test_leaving_a_run_block_by_an_exception_reports_no_terminal_event(spool_path):
    meter = offline_meter(spool_path)
    try:
        with pytest.raises(RuntimeError), meter.run("run-1", customer="cust-1") as run:
            run.started()
            raise RuntimeError("the agent crashed")
        assert not run.terminal_reported
        assert meter.stats().pending_events == 1
    finally:
        meter.close(timeout=0)


def test_a_second_meter_on_a_spool_in_use_is_refused(spool_path):
    meter = offline_meter(spool_path)
    try:
        with pytest.raises(SpoolLockedError):
            Meter(NOWHERE, "key", source=SOURCE, spool_path=spool_path, lock_timeout_s=0.1)
    finally:
        meter.close(timeout=0)


def test_bad_arguments_fail_at_the_call_not_at_the_server(spool_path):
    meter = offline_meter(spool_path)
    try:
        run = meter.run("run-1", customer="cust-1")
        with pytest.raises(ValueError, match="input_tokens"):
            run.usage(step=1, model=MODEL, input_tokens=-1, output_tokens=1)
        with pytest.raises(ValueError, match="kind"):
            run.delivered(step=1, kind="everything")
        with pytest.raises(ValueError, match="cause"):
            run.failed(cause="gremlins")
        assert meter.stats().pending_events == 0
    finally:
        meter.close(timeout=0)
