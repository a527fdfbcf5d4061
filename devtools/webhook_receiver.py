"""``make up``'s demo webhook receiver: what a tenant's backend does with Fairmeter's webhooks.

A threaded ``http.server`` on a free loopback port. Each delivery is verified with the SDK's
``fairmeter_client.webhooks.verify`` (the same call the README's receiver makes), deduplicated
on ``webhook-id`` (delivery is at least once: a retry after a lost 2xx carries the same id),
and handed to a callback once. ``describe`` turns a run's decision into the line a person in
the agent's app would read: ``webhook: run demo-… · Run failed — usage restored · 0.10 USD
restored``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from fairmeter_client.webhooks import WebhookVerificationError, verify

from metering.money import display_usd
from metering.notifications.catalogue import RUN_RESETTLED, RUN_SETTLED

# A run's decision reaches the person; every word change (run.status_changed) would be chatty.
DEMO_EVENT_TYPES = (RUN_SETTLED, RUN_RESETTLED)
MAX_BODY_BYTES = 1 << 20

OnEvent = Callable[[dict[str, Any]], None]


class DemoReceiver:
    """Verifies, dedupes and hands on deliveries; ``secret`` is set once the endpoint exists
    (its URL has to be known first), and until then every delivery is refused as unsigned."""

    def __init__(self, on_event: OnEvent, host: str = "127.0.0.1") -> None:
        self.secret: str | None = None
        self._on_event = on_event
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((host, 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/webhooks"

    def start(self) -> DemoReceiver:
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def receive(self, headers: dict[str, str], body: bytes) -> HTTPStatus:
        """The answer to one delivery: 400 if it does not verify, 204 otherwise (also for a
        repeat, which is not handed on)."""
        if self.secret is None:
            return HTTPStatus.SERVICE_UNAVAILABLE
        try:
            event = verify(self.secret, headers, body)
        except WebhookVerificationError:
            return HTTPStatus.BAD_REQUEST
        message_id = {k.lower(): v for k, v in headers.items()}.get("webhook-id", "")
        with self._lock:
            if message_id in self._seen:
                return HTTPStatus.NO_CONTENT
            self._seen.add(message_id)
            # Under the lock: one line at a time, in the order they were accepted.
            self._on_event(event)
        return HTTPStatus.NO_CONTENT

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                if length > MAX_BODY_BYTES:
                    self.send_response(HTTPStatus.REQUEST_ENTITY_TOO_LARGE)
                    self.end_headers()
                    return
                body = self.rfile.read(length)
                status = receiver.receive(dict(self.headers.items()), body)
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass  # the terminal shows the webhook lines, not an access log

        return Handler


def describe(event: dict[str, Any]) -> str | None:
    """The line for a run's decision, or ``None`` for anything else. The words are the run's
    status as ``GET /v1/runs/{run}`` shows it; the amount is what the person cares about most
    (restored, else held, else billed), never rounded to zero (``display_usd``)."""
    run = event.get("data", {}).get("run")
    if event.get("type") not in DEMO_EVENT_TYPES or not isinstance(run, dict):
        return None
    parts = [f"webhook: run {run['run']}", str(run["status"])]
    credited = "restored" if "restored" in str(run["status"]) else "credited"
    for field, verb in (("credited_micros", credited), ("held_micros", "held")):
        if run.get(field):
            parts.append(f"{display_usd(run[field])} USD {verb}")
            break
    else:
        parts.append(f"{display_usd(run.get('billed_micros') or 0)} USD billed")
    return " · ".join(parts)
