"""The emulator's in-memory world: meters, meter events, customers, balance transactions.

One ``threading.RLock`` guards every collection; the operation modules (``meters``,
``meter_events``, ``customers``) take it for each read-modify-write. Objects are plain
dataclasses; ``snapshot()`` renders them for ``GET /_emulator/state`` and test assertions.
"""

from __future__ import annotations

import itertools
import threading
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from devtools.stripe_emulator.billing_objects import Book
from devtools.stripe_emulator.clock import Clock
from devtools.stripe_emulator.settings import EmulatorSettings

LockKey = tuple[str, str]  # (customer id, event name)


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


@dataclass
class Meter:
    id: str
    display_name: str
    event_name: str
    formula: str
    customer_key: str
    value_key: str
    created: int
    status: str = "active"
    deactivated_at: int | None = None


@dataclass
class MeterEvent:
    identifier: str
    event_name: str
    meter: str
    customer: str
    value: int
    timestamp: int
    received_at: int
    payload: dict[str, str]
    idempotency_key: str | None = None
    cancelled_at: int | None = None
    # Stripe validates some things asynchronously and reports them later through
    # v1.billing.meter.error_report_triggered; such events never reach summaries.
    error_code: str | None = None
    error_message: str | None = None
    reported_in: str | None = None  # the error report (event id) that named this event

    @property
    def cancelled(self) -> bool:
        return self.cancelled_at is not None

    @property
    def counts(self) -> bool:
        return self.cancelled_at is None and self.error_code is None

    def counts_at(self, instant: int) -> bool:
        """Whether Stripe's aggregates held this event at ``instant`` (received, not cancelled)."""
        if self.error_code is not None or self.received_at > instant:
            return False
        return self.cancelled_at is None or self.cancelled_at > instant


@dataclass
class Customer:
    id: str
    created: int
    email: str | None = None
    name: str | None = None
    description: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    balance: int = 0
    currency: str | None = None
    # Stripe keeps one balance per currency; ``balance`` mirrors the default currency's.
    balances: dict[str, int] = field(default_factory=dict)


@dataclass
class BalanceTransaction:
    id: str
    customer: str
    amount: int
    currency: str
    created: int
    ending_balance: int
    description: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    type: str = "adjustment"
    invoice: str | None = None
    credit_note: str | None = None


class EmulatorState:
    """Everything the emulator remembers. Safe to share between request threads."""

    def __init__(self, clock: Clock | None = None, settings: dict[str, Any] | None = None) -> None:
        self.lock = threading.RLock()
        self.clock = clock or Clock()
        # The start-up settings: what a reset returns to (the defaults, changed by these).
        self._initial_settings = dict(settings or {})
        self.settings = self._fresh_settings()
        self.counters: Counter[str] = Counter()
        self._request_ids = itertools.count(1)
        self._clear()

    def _clear(self) -> None:
        self.meters: dict[str, Meter] = {}
        self.meters_by_event: dict[str, Meter] = {}
        self.meter_events: list[MeterEvent] = []
        # The latest event per identifier, for dedupe and cancellation.
        self.events_by_identifier: dict[str, MeterEvent] = {}
        self.events_by_series: dict[tuple[str, str], list[MeterEvent]] = {}
        self.customers: dict[str, Customer] = {}
        self.balance_transactions: dict[str, list[BalanceTransaction]] = {}
        self.in_flight: set[LockKey] = set()
        self.events: dict[str, dict[str, Any]] = {}  # delivered webhook events by id
        self.invoices: dict[str, dict[str, Any]] = {}
        self.deliveries: list[dict[str, Any]] = []
        # Subscriptions, invoices, credit notes, destinations and the event outbox.
        self.book = Book()

    def _fresh_settings(self) -> EmulatorSettings:
        settings = EmulatorSettings()
        settings.update(self._initial_settings)
        return settings

    def reset(self) -> None:
        """Forget all objects and counters; settings return to those given at start-up and
        the clock to wall time."""
        with self.lock:
            self._clear()
            self.counters.clear()
            self.settings = self._fresh_settings()
            self.clock.reset()

    def next_request_id(self) -> str:
        return f"req_{next(self._request_ids):014d}"

    def count(self, name: str) -> None:
        with self.lock:
            self.counters[name] += 1

    def try_enter(self, key: LockKey) -> bool:
        """Claim the (customer, meter) slot; False when another request holds it."""
        with self.lock:
            if self.settings.lock_rule and key in self.in_flight:
                return False
            self.in_flight.add(key)
            return True

    def leave(self, key: LockKey) -> None:
        with self.lock:
            self.in_flight.discard(key)

    def add_meter_event(self, event: MeterEvent) -> None:
        self.meter_events.append(event)
        self.events_by_identifier[event.identifier] = event
        self.events_by_series.setdefault((event.meter, event.customer), []).append(event)

    def events_for(self, customer: str) -> list[MeterEvent]:
        with self.lock:
            return [event for event in self.meter_events if event.customer == customer]

    def snapshot(self) -> dict[str, Any]:
        """A JSON-ready copy of the whole state (``GET /_emulator/state``)."""
        with self.lock:
            return {
                "now": self.clock.now(),
                "clock": self.clock.describe(),
                "settings": self.settings.as_dict(),
                "meters": [asdict(meter) for meter in self.meters.values()],
                "customers": [asdict(customer) for customer in self.customers.values()],
                "meter_events": [_event_row(event) for event in self.meter_events],
                "balance_transactions": [
                    asdict(txn) for txns in self.balance_transactions.values() for txn in txns
                ],
                "in_flight": [list(key) for key in sorted(self.in_flight)],
                "counters": dict(self.counters),
                "webhook_deliveries": list(self.deliveries),
                **self.book.snapshot(),
            }


def _event_row(event: MeterEvent) -> dict[str, Any]:
    row = asdict(event)
    row["cancelled"] = event.cancelled
    return row
