"""Following a status stream without a Fairmeter server: the Server-Sent Events parsing rules,
and reconnection against a scripted HTTP server on loopback (drops, refusals, silence)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import islice
from typing import Any

import pytest
from fairmeter_client import StreamRefusedError, follow_customer, follow_run
from fairmeter_client.follow import Message, parse


def test_messages_are_assembled_as_the_whatwg_rules_say():
    lines = ["retry: 10", "", ": a comment", "id: 5", "event: x", "data: a", "data:b", ""]
    lines += ["data: c", "", "id", "data: d", "", "retry: soon", "data: e", ""]
    assert list(parse(lines)) == [
        Message("message", "", None, 10),
        Message("x", "a\nb", "5", None),
        Message("message", "c", "5", None),  # the last id stays in force
        Message("message", "d", "", None),  # an empty id resets it
        Message("message", "e", "", None),  # a retry that is not a number is ignored
    ]
    assert list(parse([": only a comment", ""])) == []


def frame(nid: int, kind: str = "run.status_changed", *, with_id: bool = True) -> bytes:
    body = {"type": kind, "id": nid, "run": "run-1", "customer": "c", "created_at": "t"}
    body["data"] = {"n": nid}
    head = f"id: {nid}\n" if with_id else ""
    return f"{head}event: {kind}\ndata: {json.dumps(body)}\n\n".encode()


class Script:
    """What the server answers, one entry per connection: status, headers, body chunks, and
    whether to hang (send nothing more) instead of closing after them."""

    def __init__(self, *replies: tuple[int, dict[str, str], list[bytes], bool]) -> None:
        self.replies = list(replies)
        self.requests: list[dict[str, str]] = []
        self.paths: list[str] = []


@contextmanager
def server(script: Script) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # the body ends when the connection closes

        def do_GET(self) -> None:
            script.requests.append({k.lower(): v for k, v in self.headers.items()})
            script.paths.append(self.path)
            status, headers, chunks, hang = script.replies.pop(0)
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            for chunk in chunks:
                self.wfile.write(chunk)
                self.wfile.flush()
            if hang:
                time.sleep(5)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


SSE = {"Content-Type": "text/event-stream"}


def test_a_dropped_stream_is_resumed_after_the_last_event_with_nothing_repeated():
    script = Script(
        (200, SSE, [b"retry: 10\n\n", frame(1, "run.status"), frame(2)], False),
        (200, SSE, [b"retry: 10\n\n", frame(3)], False),
        # a late notification comes without an id line: the resume point stays at 3
        (200, SSE, [frame(2, with_id=False), frame(4)], True),
    )
    with server(script) as base:
        events = list(islice(follow_run(base, "key-1", "run-1"), 5))
    assert [(e.type, e.id) for e in events] == [
        ("run.status", 1),
        ("run.status_changed", 2),
        ("run.status_changed", 3),
        ("run.status_changed", 2),
        ("run.status_changed", 4),
    ]
    assert events[3].data == {"n": 2}
    assert [r.get("last-event-id") for r in script.requests] == [None, "2", "3"]
    assert all(r["authorization"] == "Bearer key-1" for r in script.requests)
    assert script.paths[0] == "/v1/runs/run-1/stream"


def test_a_refused_stream_raises_with_the_problem_and_is_not_retried():
    problem = json.dumps({"code": "run_not_found", "detail": "no run run-1"}).encode()
    script = Script((404, {"Content-Type": "application/problem+json"}, [problem], False))
    with server(script) as base, pytest.raises(StreamRefusedError) as refused:
        next(follow_run(base, "key", "run-1"))
    assert (refused.value.status, refused.value.code) == (404, "run_not_found")
    assert len(script.requests) == 1


def test_an_unavailable_server_is_retried_after_its_retry_after():
    script = Script(
        (503, {"Retry-After": "0"}, [b"{}"], False),
        (200, SSE, [frame(9)], True),
    )
    with server(script) as base:
        event = next(follow_run(base, "key", "run-1", last_event_id=8, max_backoff_s=0.05))
    assert event.id == 9
    assert [r.get("last-event-id") for r in script.requests] == ["8", "8"]


def test_a_silent_connection_is_given_up_after_the_read_timeout_and_resumed():
    script = Script(
        (200, SSE, [b"retry: 10\n\n", frame(7)], True),  # then nothing, not even heartbeats
        (200, SSE, [frame(8)], True),
    )
    with server(script) as base:
        stream = follow_customer(base, "key", "a b", read_timeout_s=0.5)
        assert [e.id for e in islice(stream, 2)] == [7, 8]
    assert script.paths[0] == "/v1/customers/a%20b/stream"
    assert script.requests[1]["last-event-id"] == "7"
