"""The Stripe gateway: the official SDK's StripeClient, with explicit retries and timeouts.

Everything the rest of the code needs from Stripe goes through :class:`StripeGateway`, and
every SDK error is classified once, here, into what the pusher should do about it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum
from typing import Any

import stripe

from metering.billing.transport import KeepAliveClient
from metering.config import Settings


class Verdict(Enum):
    DELIVERED = "delivered"  # Stripe already has it (duplicate identifier)
    RETRY = "retry"  # 429, 5xx, timeouts, dropped connections
    DEAD = "dead"  # any other 4xx: retrying cannot help


DUPLICATE_IDENTIFIER = "An event already exists with identifier"
CONNECT_TIMEOUT_S = 3.0


def classify(exc: Exception) -> Verdict:
    if isinstance(exc, stripe.InvalidRequestError) and DUPLICATE_IDENTIFIER in str(exc):
        return Verdict.DELIVERED
    if isinstance(exc, stripe.RateLimitError | stripe.APIConnectionError):
        return Verdict.RETRY
    if isinstance(exc, stripe.StripeError):
        status = exc.http_status or 0
        if status == 429 or status >= 500 or status == 0:
            return Verdict.RETRY
        if getattr(exc, "code", None) == "lock_timeout":
            return Verdict.RETRY
        return Verdict.DEAD
    return Verdict.RETRY


@dataclass(frozen=True, slots=True)
class SummaryBucket:
    start: datetime
    end: datetime
    value: int


def build_client(settings: Settings) -> stripe.StripeClient:
    base = settings.stripe_api_base
    addresses: dict[str, str] = {}
    if base:
        addresses = {"api": base, "meter_events": base, "files": base, "connect": base}
    # A kept-alive http.client transport instead of requests, which cost more client CPU
    # per call than the SDK and the emulator together (see transport.py); explicit connect
    # and read timeouts.
    return stripe.StripeClient(
        settings.stripe_api_key or "sk_test_emulator",
        base_addresses=addresses or None,  # type: ignore[arg-type]
        max_network_retries=settings.stripe_max_network_retries,
        http_client=KeepAliveClient(
            connect_timeout_s=CONNECT_TIMEOUT_S, read_timeout_s=settings.stripe_timeout_s
        ),
    )


def _utc(seconds: int) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


class StripeGateway:
    """Thin, typed calls. One instance per thread (the HTTP session is not shared)."""

    def __init__(self, settings: Settings) -> None:
        self._client = build_client(settings)
        self._event_name = settings.stripe_meter_event_name

    def send_meter_event(
        self, *, identifier: str, customer: str, value: int, timestamp: datetime, key: str
    ) -> datetime:
        """Returns when Stripe received the event (its ``created``)."""
        event = self._client.v1.billing.meter_events.create(
            params={
                "event_name": self._event_name,
                "identifier": identifier,
                "payload": {"stripe_customer_id": customer, "value": str(value)},
                "timestamp": int(timestamp.timestamp()),
            },
            options={"idempotency_key": key},
        )
        return _utc(int(event.created))

    def cancel_meter_event(self, *, identifier: str, key: str) -> None:
        self._client.v1.billing.meter_event_adjustments.create(
            params={
                "event_name": self._event_name,
                "type": "cancel",
                "cancel": {"identifier": identifier},
            },
            options={"idempotency_key": key},
        )

    def credit_balance(
        self, *, customer: str, cents: int, description: str, metadata: dict[str, str], key: str
    ) -> None:
        self._client.v1.customers.balance_transactions.create(
            customer,
            params={
                "amount": -cents,
                "currency": "usd",
                "description": description,
                "metadata": metadata,
            },
            options={"idempotency_key": key},
        )

    def fetch_event(self, event_id: str) -> dict[str, Any]:
        """The full payload of a thin event (its notification carries no data)."""
        event = self._client.v2.core.events.retrieve(event_id)
        payload: dict[str, Any] = event.to_dict()
        return payload

    def meter_id(self, create: bool = False) -> str:
        """The id of the meter for our event name (created on demand when ``create``)."""
        for meter in self._client.v1.billing.meters.list(params={"limit": 100}).auto_paging_iter():
            if meter.event_name == self._event_name:
                return str(meter.id)
        if not create:
            raise LookupError(f"no Stripe meter for event name {self._event_name}")
        meter = self._client.v1.billing.meters.create(
            params={
                "display_name": "Fairmeter billed usage",
                "event_name": self._event_name,
                "default_aggregation": {"formula": "sum"},
                "customer_mapping": {"event_payload_key": "stripe_customer_id", "type": "by_id"},
                "value_settings": {"event_payload_key": "value"},
            }
        )
        return str(meter.id)

    def hourly_summaries(
        self, *, meter_id: str, customer: str, start: datetime, end: datetime
    ) -> list[SummaryBucket]:
        page: Any = self._client.v1.billing.meters.event_summaries.list(
            meter_id,
            params={
                "customer": customer,
                "start_time": int(start.timestamp()),
                "end_time": int(end.timestamp()),
                "value_grouping_window": "hour",
                "limit": 100,
            },
        )
        return [
            SummaryBucket(_utc(s.start_time), _utc(s.end_time), round(s.aggregated_value))
            for s in page.auto_paging_iter()
        ]
