"""The Stripe endpoints the emulator serves: (method, path pattern) → handler."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from devtools.stripe_emulator import (
    credit_notes,
    customers,
    invoicing,
    meter_events,
    meters,
    prices,
    subscriptions,
)
from devtools.stripe_emulator.errors import resource_missing
from devtools.stripe_emulator.forms import Params
from devtools.stripe_emulator.state import EmulatorState, LockKey


@dataclass(frozen=True)
class Call:
    """One parsed API request, as a handler sees it."""

    state: EmulatorState
    params: Params
    args: tuple[str, ...]
    idempotency_key: str | None
    api_version: str


Handler = Callable[[Call], dict[str, Any]]
LockKeyFor = Callable[[EmulatorState, Params], LockKey | None]


@dataclass(frozen=True)
class Route:
    method: str
    pattern: re.Pattern[str]
    handler: Handler
    lock_key: LockKeyFor | None = None

    @property
    def endpoint(self) -> str:
        """The named operation ("GET /v1/customers/{id}") Stripe's per-endpoint limit counts."""
        return f"{self.method} {self.pattern.pattern.replace(_ID, '{id}')}"


def _stored_event(call: Call) -> dict[str, Any]:
    with call.state.lock:
        event = call.state.events.get(call.args[0])
    if event is None:
        raise resource_missing("event", call.args[0])
    return event


_ID = r"([A-Za-z0-9_\-.:]+)"
ROUTES = [
    Route(
        "POST",
        re.compile(r"/v1/billing/meter_events"),
        lambda c: meter_events.create_meter_event(c.state, c.params, c.idempotency_key),
        meter_events.lock_key,
    ),
    Route(
        "POST",
        re.compile(r"/v1/billing/meter_event_adjustments"),
        lambda c: meter_events.cancel_meter_event(c.state, c.params),
    ),
    Route(
        "POST", re.compile(r"/v1/billing/meters"), lambda c: meters.create_meter(c.state, c.params)
    ),
    Route(
        "GET", re.compile(r"/v1/billing/meters"), lambda c: meters.list_meters(c.state, c.params)
    ),
    Route(
        "GET",
        re.compile(rf"/v1/billing/meters/{_ID}"),
        lambda c: meters.retrieve_meter(c.state, c.args[0]),
    ),
    Route(
        "GET",
        re.compile(rf"/v1/billing/meters/{_ID}/event_summaries"),
        lambda c: meters.list_event_summaries(c.state, c.args[0], c.params),
    ),
    Route(
        "POST", re.compile(r"/v1/customers"), lambda c: customers.create_customer(c.state, c.params)
    ),
    Route(
        "GET", re.compile(r"/v1/customers"), lambda c: customers.list_customers(c.state, c.params)
    ),
    Route(
        "GET",
        re.compile(rf"/v1/customers/{_ID}"),
        lambda c: customers.retrieve_customer(c.state, c.args[0]),
    ),
    Route(
        "DELETE",
        re.compile(rf"/v1/customers/{_ID}"),
        lambda c: customers.delete_customer(c.state, c.args[0]),
    ),
    Route(
        "POST",
        re.compile(rf"/v1/customers/{_ID}/balance_transactions"),
        lambda c: customers.create_balance_transaction(c.state, c.args[0], c.params),
    ),
    Route(
        "GET",
        re.compile(rf"/v1/customers/{_ID}/balance_transactions"),
        lambda c: customers.list_balance_transactions(c.state, c.args[0], c.params),
    ),
    Route("GET", re.compile(rf"/v1/events/{_ID}"), _stored_event),
    Route("GET", re.compile(rf"/v2/core/events/{_ID}"), _stored_event),
    Route(
        "POST",
        re.compile(rf"/v1/billing/meters/{_ID}/deactivate"),
        lambda c: meters.set_meter_status(c.state, c.args[0], active=False),
    ),
    Route(
        "POST",
        re.compile(rf"/v1/billing/meters/{_ID}/reactivate"),
        lambda c: meters.set_meter_status(c.state, c.args[0], active=True),
    ),
    Route("POST", re.compile(r"/v1/prices"), lambda c: prices.create_price(c.state, c.params)),
    Route("GET", re.compile(r"/v1/prices"), lambda c: prices.list_prices(c.state, c.params)),
    Route(
        "GET", re.compile(rf"/v1/prices/{_ID}"), lambda c: prices.retrieve_price(c.state, c.args[0])
    ),
    Route(
        "POST",
        re.compile(r"/v1/subscriptions"),
        lambda c: subscriptions.create_subscription(c.state, c.params),
    ),
    Route(
        "GET",
        re.compile(rf"/v1/subscriptions/{_ID}"),
        lambda c: subscriptions.retrieve_subscription(c.state, c.args[0]),
    ),
    Route("GET", re.compile(r"/v1/invoices"), lambda c: invoicing.list_invoices(c.state, c.params)),
    Route(
        "GET",
        re.compile(rf"/v1/invoices/{_ID}"),
        lambda c: invoicing.retrieve_invoice(c.state, c.args[0]),
    ),
    Route(
        "GET",
        re.compile(rf"/v1/invoices/{_ID}/lines"),
        lambda c: invoicing.list_invoice_lines(c.state, c.args[0], c.params),
    ),
    Route(
        "POST",
        re.compile(rf"/v1/invoices/{_ID}/void"),
        lambda c: invoicing.void_invoice(c.state, c.args[0], c.params),
    ),
    Route(
        "POST",
        re.compile(rf"/v1/invoices/{_ID}/pay"),
        lambda c: invoicing.pay_invoice(c.state, c.args[0], c.params),
    ),
    Route(
        "POST",
        re.compile(r"/v1/credit_notes"),
        lambda c: credit_notes.create_credit_note(c.state, c.params),
    ),
    Route(
        "GET",
        re.compile(r"/v1/credit_notes"),
        lambda c: credit_notes.list_credit_notes(c.state, c.params),
    ),
    Route(
        "GET",
        re.compile(rf"/v1/credit_notes/{_ID}"),
        lambda c: credit_notes.retrieve_credit_note(c.state, c.args[0]),
    ),
]


def match(method: str, path: str) -> tuple[Route, tuple[str, ...]] | None:
    for route in ROUTES:
        if route.method == method:
            found = route.pattern.fullmatch(path)
            if found:
                return route, found.groups()
    return None
