"""What the emulator tests share besides fixtures: the official SDK pointed at an emulator,
the meter's event name, and a webhook endpoint that records what it receives."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import stripe

EVENT_NAME = "fairmeter_usage"


def make_client(
    url: str, *, retries: int = 0, timeout_s: float | None = None
) -> stripe.StripeClient:
    http_client = stripe.RequestsClient(timeout=timeout_s) if timeout_s else None
    return stripe.StripeClient(
        "sk_test_emulator",
        base_addresses={"api": url, "meter_events": url, "files": url, "connect": url},
        max_network_retries=retries,
        http_client=http_client,
    )


SendEvent = Callable[..., stripe.billing.MeterEvent]


class Inbox:
    """A webhook endpoint that records each delivery's raw body and headers."""

    def __init__(self) -> None:
        self.deliveries: list[tuple[bytes, dict[str, str]]] = []
        inbox = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                inbox.deliveries.append((body, dict(self.headers)))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/webhooks/stripe"

    def __enter__(self) -> Inbox:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
