"""A real webhook receiver on loopback, and notifications recorded as the product records them.

The receiver is a threaded ``http.server`` that verifies every request with
``standardwebhooks.Webhook(secret).verify(body, headers)`` from PyPI, unchanged, answers
400 to a bad signature, and otherwise 2xx or whatever the test asks for (a seeded share of
500s, a hang, being down). It deduplicates on ``webhook-id`` as a receiver should, and
keeps every request in arrival order so tests can check order and duplicates.
"""

from __future__ import annotations

import hmac
import itertools
import json
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standardwebhooks import Webhook, WebhookVerificationError

from metering.db import raw_transaction
from metering.notifications import Notification, record
from tests.helpers.processes import free_port


@dataclass
class Received:
    seq: int  # arrival order
    msg_id: str
    headers: dict[str, str]
    body: bytes
    verified: bool
    status: int
    answered_seq: int = -1  # the order in which the answer was sent
    at: datetime | None = None  # on the receiver's ``clock``, when it has one
    arrived_s: float = 0.0  # ``time.monotonic()`` when the request arrived

    @property
    def payload(self) -> dict[str, Any]:
        return dict(json.loads(self.body))


@dataclass
class Receiver:
    """``secrets``: what it verifies with (any one suffices, as the library does with the
    signatures). ``fail_rate``: the seeded share of verified requests answered 500.
    ``hang``: while set, requests wait until it is cleared (or the client goes away).
    ``clock``: stamps each arrival, for a test that drives time through an injected clock.
    ``stop()`` then ``start()`` again is an outage: connections refused, same port."""

    secrets: list[str] = field(default_factory=list)
    fail_rate: float = 0.0
    seed: int = 16
    status: int = 200
    port: int = field(default_factory=free_port)
    requests: list[Received] = field(default_factory=list)
    hang: threading.Event = field(default_factory=threading.Event)
    hung: threading.Event = field(default_factory=threading.Event)
    clock: Callable[[], datetime] | None = None

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._random = random.Random(self.seed)
        self._seq = itertools.count()
        self._server: ThreadingHTTPServer | None = None
        self.processed: list[str] = []  # webhook-ids acted on, once each, in order

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks"

    def start(self) -> Receiver:
        handler = _handler(self)
        ThreadingHTTPServer.allow_reuse_address = True
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> Receiver:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.hang.clear()
        self.stop()

    def verify(self, body: bytes, headers: dict[str, str]) -> bool:
        if self.clock is not None:
            return self._verify_on_clock(body, headers, self.clock())
        for secret in self.secrets:
            try:
                Webhook(secret).verify(body, headers)
            except WebhookVerificationError:
                continue
            return True
        return False

    def _verify_on_clock(self, body: bytes, headers: dict[str, str], now: datetime) -> bool:
        """``verify`` for a receiver living on an injected clock: the library's window of
        five minutes is checked against that clock (the library reads the wall clock), the
        signature is the library's own ``Webhook.sign``, compared as ``verify`` does."""
        try:
            sent = datetime.fromtimestamp(float(headers["webhook-timestamp"]), tz=UTC)
            given = {s.split(",", 1)[1] for s in headers["webhook-signature"].split(" ")}
        except (KeyError, ValueError, IndexError):
            return False
        if abs(now - sent) > timedelta(minutes=5):
            return False
        msg_id, text = headers.get("webhook-id", ""), body.decode()
        expected = {Webhook(s).sign(msg_id, sent, text).split(",", 1)[1] for s in self.secrets}
        return any(hmac.compare_digest(e, g) for e in expected for g in given)

    def answer(self, msg_id: str, verified: bool) -> int:
        """The status for one request, and the dedupe a real receiver does."""
        with self._lock:
            if not verified:
                return 400
            if self.fail_rate and self._random.random() < self.fail_rate:
                return 500
            if 200 <= self.status < 300 and msg_id not in self.processed:
                self.processed.append(msg_id)
            return self.status

    def received(self, msg_id: str) -> list[Received]:
        return [r for r in self.requests if r.msg_id == msg_id]

    def accepted(self) -> list[Received]:
        return [r for r in self.requests if 200 <= r.status < 300]


def _handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("content-length", "0"))
            body = self.rfile.read(length)
            headers = {k.lower(): v for k, v in self.headers.items()}
            msg_id = headers.get("webhook-id", "")
            at = receiver.clock() if receiver.clock else None
            arrived_s = time.monotonic()
            with receiver._lock:
                seq = next(receiver._seq)
            while receiver.hang.is_set():
                receiver.hung.set()
                time.sleep(0.05)
            verified = receiver.verify(body, headers)
            status = receiver.answer(msg_id, verified)
            got = Received(seq, msg_id, headers, body, verified, status, at=at, arrived_s=arrived_s)
            with receiver._lock:
                got.answered_seq = next(receiver._seq)
                receiver.requests.append(got)
            reply = json.dumps({"ok": 200 <= status < 300}).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *_: Any) -> None:
            pass

    return Handler


def customer(engine: Any, tenant: str = "acme", customer_id: str = "cust-1") -> None:
    with raw_transaction(engine) as conn:
        conn.execute("INSERT INTO tenants (id) VALUES (%s) ON CONFLICT DO NOTHING", (tenant,))
        conn.execute(
            "INSERT INTO customers (tenant_id, id) VALUES (%s, %s) ON CONFLICT DO NOTHING",
            (tenant, customer_id),
        )


def notify(
    engine: Any,
    type_: str = "run.status_changed",
    *,
    tenant: str = "acme",
    customer_id: str = "cust-1",
    run: str | None = None,
    **data: Any,
) -> int:
    """Record one notification in a transaction of its own, about ``run`` (a stored run of
    the tenant) when given; its id."""
    with raw_transaction(engine) as conn:
        run_id = None
        if run is not None:
            row = conn.execute(
                "SELECT id FROM runs WHERE tenant_id = %s AND subject = %s", (tenant, run)
            ).fetchone()
            assert row is not None, f"no run {run}"
            run_id = int(row[0])
        return record(
            conn, Notification(tenant, customer_id, type_, dict(data), run_id=run_id, subject=run)
        )


def wait_for(predicate: Callable[[], bool], timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        time.sleep(0.1)


def add_endpoint(
    engine: Any, settings: Any, url: str, *, tenant: str = "acme", types: tuple[str, ...] = ()
) -> tuple[str, str]:
    """An endpoint made through the use case (private targets allowed, as the tests' are on
    loopback): (its id, its secret)."""
    from metering.keys import Principal, Scope
    from metering.webhooks.endpoints import EndpointSpec, create_endpoint

    allowed = settings.model_copy(update={"webhooks_allow_private": True})
    customer(engine, tenant)
    with raw_transaction(engine) as conn:
        view, secret = create_endpoint(
            conn, Principal(tenant, Scope.ADMIN, "test"), EndpointSpec(url, types), allowed
        )
    return view.id, secret


def messages(db: Any, endpoint_id: str | None = None) -> list[tuple[Any, ...]]:
    """(msg_id, run subject, notification id, status, attempts) of the messages, in order."""
    return list(
        db.execute(
            "SELECT msg_id, subject, notification_id, status, attempts FROM webhook_messages "
            "WHERE %(e)s::text IS NULL OR endpoint_id = %(e)s ORDER BY notification_id, id",
            {"e": endpoint_id},
        ).fetchall()
    )
