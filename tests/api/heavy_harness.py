"""What the heavy-request tests share (tests/api/test_heavy_requests.py): OTLP exports of
many model calls, a client that gives up and closes its socket, and the backends PostgreSQL
is still working for or waiting on a lock for."""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import httpx
import psycopg

from metering.config import Settings
from metering.otlp import decode_otlp_json

# How long the served API waits for a lock in the tests of caps and disconnects: far longer
# than a test waits for anything, so that what ends a request there is the test's doing.
PATIENCE_S = 120.0
# How long a test waits for something the API does at once (a blocked request showing up
# in pg_stat_activity, a cancelled one going away), on a slow shared machine.
PROMPT_S = 15.0


def chat_export(run: str, customer: str, spans: int, *, genai: bool = True) -> bytes:
    """An OTLP/JSON export of ``spans`` model calls of ``run`` (each its own event), ended a
    second ago; with ``genai=False``, spans of no GenAI operation (ignored, but counted)."""
    end_ns = time.time_ns() - 1_000_000_000
    attributes = {
        "gen_ai.operation.name": {"stringValue": "chat"},
        "gen_ai.request.model": {"stringValue": "agent-small-1"},
        "gen_ai.usage.input_tokens": {"intValue": "100"},
        "gen_ai.usage.output_tokens": {"intValue": "10"},
        "fairmeter.run.id": {"stringValue": run},
        "fairmeter.customer.id": {"stringValue": customer},
    }
    if not genai:
        attributes = {"http.route": {"stringValue": "/orders"}}
    trace = uuid.uuid4().hex
    listed = [{"key": key, "value": value} for key, value in attributes.items()]
    document = {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [{"key": "service.name", "value": {"stringValue": "a"}}]
                },
                "scopeSpans": [{"spans": [_span(trace, i, end_ns, listed) for i in range(spans)]}],
            }
        ]
    }
    return json.dumps(document).encode()


def _span(trace: str, index: int, end_ns: int, attributes: list[Any]) -> dict[str, Any]:
    return {
        "traceId": trace,
        "spanId": f"{index + 1:016x}",
        "name": "chat agent-small-1",
        "kind": 3,
        "startTimeUnixNano": str(end_ns - 500_000_000),
        "endTimeUnixNano": str(end_ns),
        "attributes": attributes,
    }


def as_protobuf(body: bytes) -> bytes:
    """An OTLP/JSON export in OTLP's binary protobuf encoding."""
    return decode_otlp_json(body).SerializeToString()


@contextmanager
def abandoned(base: str, path: str, key: str, body: bytes, content_type: str) -> Iterator[None]:
    """A POST sent whole over a socket of its own, which is closed when the block ends
    without reading the reply: a client that timed out and gave up."""
    url = urlsplit(base)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {url.netloc}\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    with socket.create_connection((url.hostname, url.port), timeout=PROMPT_S) as client:
        client.sendall(head.encode() + body)
        yield


def lock_waiters(db: psycopg.Connection[Any]) -> int:
    """Backends of the test database waiting for a lock (a blocked heavy request)."""
    row = db.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND wait_event_type = 'Lock'"
    ).fetchone()
    assert row is not None
    return int(row[0])


@contextmanager
def locked(settings: Settings, statement: str, *params: Any) -> Iterator[None]:
    """``statement`` (a LOCK TABLE, a SELECT … FOR UPDATE) holding its locks while the block
    runs, in a transaction of its own that is rolled back after."""
    with psycopg.connect(settings.libpq_url()) as conn:
        conn.execute(statement, params or None)
        try:
            yield
        finally:
            conn.rollback()


class Pending:
    """A request sent on a thread that waits as long as the API does; ``reply()`` joins."""

    def __init__(self, send: Callable[..., httpx.Response], *args: Any) -> None:
        self._reply: list[Any] = []
        self._thread = threading.Thread(target=self._run, args=(send, *args), daemon=True)
        self._thread.start()

    def _run(self, send: Callable[..., httpx.Response], *args: Any) -> None:
        try:
            self._reply.append(send(*args))
        except Exception as error:  # shown by reply()
            self._reply.append(error)

    def running(self) -> bool:
        """Whether the reply is still awaited."""
        return self._thread.is_alive()

    def reply(self) -> httpx.Response:
        self._thread.join(PATIENCE_S)
        reply = self._reply[0]
        assert isinstance(reply, httpx.Response), reply
        return reply
