"""Helpers for the emulator's billing tests: a calendar, an SDK client, usage, a receiver.

Plain functions and classes (no fixtures): the tests take ``server``, ``client``, ``control``,
``meter`` and ``customer`` from conftest and these helpers for the rest.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import stripe

from devtools.stripe_emulator.control_client import EmulatorControl

EVENT_NAME = "fairmeter_usage"
SNAPSHOT_SECRET = "whsec_snapshot_destination"
THIN_SECRET = "whsec_thin_destination"
HOUR_S = 3600
DAY_S = 86400


def at(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> int:
    """A UTC instant as unix seconds."""
    return int(datetime(year, month, day, hour, minute, tzinfo=UTC).timestamp())


JAN_1 = at(2026, 1, 1)
FEB_1 = at(2026, 2, 1)
MAR_1 = at(2026, 3, 1)


def sdk(url: str, *, retries: int = 0) -> stripe.StripeClient:
    """The official SDK pointed at the emulator."""
    return stripe.StripeClient(
        "sk_test_emulator",
        base_addresses={"api": url, "meter_events": url, "files": url, "connect": url},
        max_network_retries=retries,
    )


def send_usage(
    client: stripe.StripeClient,
    customer_id: str,
    value: int | str,
    *,
    timestamp: int,
    identifier: str,
    event_name: str = EVENT_NAME,
    key: str | None = None,
) -> stripe.billing.MeterEvent:
    params: dict[str, Any] = {
        "event_name": event_name,
        "identifier": identifier,
        "payload": {"stripe_customer_id": customer_id, "value": str(value)},
        "timestamp": timestamp,
    }
    options: dict[str, Any] = {"idempotency_key": key} if key else {}
    return client.v1.billing.meter_events.create(params=params, options=options)  # type: ignore[arg-type]


def cancel_usage(client: stripe.StripeClient, identifier: str) -> None:
    client.v1.billing.meter_event_adjustments.create(
        params={"event_name": EVENT_NAME, "type": "cancel", "cancel": {"identifier": identifier}}
    )


def summed_usage(
    client: stripe.StripeClient, meter_id: str, customer_id: str, start: int, end: int
) -> int:
    """What the meter's summaries say the customer used in [start, end)."""
    page = client.v1.billing.meters.event_summaries.list(
        meter_id,
        params={"customer": customer_id, "start_time": start, "end_time": end},
    )
    return sum(int(row.aggregated_value) for row in page.auto_paging_iter())


def wait_out_summary_lag(control: EmulatorControl) -> None:
    """Move the emulator clock past the summary lag (on by default, as summaries are
    eventually consistent on Stripe), so a test that reads its own writes sees them."""
    control.advance_clock(int(control.state()["settings"]["summary_lag_s"]))


def invoices_of(client: stripe.StripeClient, customer_id: str) -> list[stripe.Invoice]:
    return list(client.v1.invoices.list(params={"customer": customer_id}).auto_paging_iter())


class Receiver:
    """An HTTP endpoint that records each delivery's raw body and headers."""

    def __init__(self) -> None:
        self.deliveries: list[tuple[str, dict[str, str]]] = []
        received = self.deliveries

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                received.append((body.decode(), dict(self.headers)))
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
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def snapshot_events(self, secret: str = SNAPSHOT_SECRET) -> list[stripe.Event]:
        """Every delivery verified as a snapshot event with ``secret`` (raises if one fails)."""
        return [
            stripe.Webhook.construct_event(body, headers["Stripe-Signature"], secret)
            for body, headers in self.deliveries
        ]

    def wait_for(self, count: int, timeout_s: float = 10.0) -> None:
        """Wait until ``count`` deliveries arrived (events queued by API calls come later)."""
        deadline = time.monotonic() + timeout_s
        while len(self.deliveries) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(self.deliveries)} of {count} deliveries arrived")
            time.sleep(0.02)


@contextmanager
def receiver() -> Iterator[Receiver]:
    endpoint = Receiver()
    try:
        yield endpoint
    finally:
        endpoint.close()
