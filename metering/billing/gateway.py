"""The Stripe gateway: the official SDK's StripeClient, with explicit retries and timeouts.

Everything the rest of the code needs from Stripe goes through :class:`StripeGateway`, and
every SDK error is classified once, here, into what the pusher should do about it. The API
version is pinned (``Settings.stripe_api_version``) and calls pass a client-side rate limit
at Stripe's documented rates ("Rate limits").
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from enum import Enum
from typing import Any

import stripe

from metering.billing.ratelimit import RateLimiter, shared_limiter
from metering.billing.transport import KeepAliveClient
from metering.config import Settings

# What a failed Stripe call raises, for the callers that only need to know it failed: the
# SDK stays behind this module.
StripeFailure = stripe.StripeError


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


def replayed_server_error(exc: Exception) -> bool:
    """A 5xx that Stripe replayed from its idempotency store ("Retries with the same key
    return the saved response, including 500 errors"): retrying that key can never succeed,
    and whether the first request took effect is unknown — only reconciling tells."""
    if not isinstance(exc, stripe.StripeError):
        return False
    headers = {k.lower(): v for k, v in (exc.headers or {}).items()}
    return (exc.http_status or 0) >= 500 and headers.get("idempotent-replayed") == "true"


def used_with_other_parameters(exc: Exception) -> bool:
    """Stripe refused an idempotency key first used with other parameters ("Idempotent
    requests": "The idempotency layer compares incoming parameters to those of the original
    request and errors if they're not the same"; it saves results "only after the execution
    of an endpoint begins"): the earlier request with that key was executed."""
    return isinstance(exc, stripe.IdempotencyError)


@dataclass(frozen=True, slots=True)
class InvoiceView:
    """A finalized invoice as a credit note needs it."""

    id: str
    status: str
    currency: str
    amount_remaining: int
    line_id: str | None  # the metered line for our meter
    unit_amount_minor: Decimal
    line_quantity: int = 0
    line_amount_minor: int = 0
    amount_paid: int = 0  # paid by charge; what the balance paid is not in it


@dataclass(frozen=True, slots=True)
class CreditNoteView:
    """A credit note on an invoice, as issuing the next one needs it."""

    id: str
    amount_minor: int
    identifier: str | None  # ours: metadata.fairmeter_identifier
    refunded_minor: int  # what it refunded to the customer's payment


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
        stripe_version=settings.stripe_api_version,
        max_network_retries=settings.stripe_max_network_retries,
        http_client=KeepAliveClient(
            connect_timeout_s=CONNECT_TIMEOUT_S, read_timeout_s=settings.stripe_timeout_s
        ),
    )


def _utc(seconds: int) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


class StripeGateway:
    """Thin, typed calls. One instance per thread (the HTTP session is not shared)."""

    def __init__(self, settings: Settings, limiter: RateLimiter | None = None) -> None:
        self._client = build_client(settings)
        self._event_name = settings.stripe_meter_event_name
        # Stripe counts per account; all threads of a process share these buckets.
        self._limiter = limiter or shared_limiter(settings.stripe_rate_limit_per_s)
        self._meter_limiter = shared_limiter(settings.stripe_meter_event_rate_limit_per_s)
        self._price_meters: dict[str, str | None] = {}
        self._meter: str | None = None  # our meter's id never changes once found

    def send_meter_event(
        self, *, identifier: str, customer: str, value: int, timestamp: datetime, key: str
    ) -> datetime:
        """Returns when Stripe received the event (its ``created``)."""
        self._meter_limiter.acquire()
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
        self._limiter.acquire()
        self._client.v1.billing.meter_event_adjustments.create(
            params={
                "event_name": self._event_name,
                "type": "cancel",
                "cancel": {"identifier": identifier},
            },
            options={"idempotency_key": key},
        )

    def fetch_event(self, event_id: str) -> dict[str, Any]:
        """The full payload of a thin event (its notification carries no data)."""
        self._limiter.acquire()
        event = self._client.v2.core.events.retrieve(event_id)
        payload: dict[str, Any] = event.to_dict()
        return payload

    def meter_id(self, create: bool = False) -> str:
        """The id of the meter for our event name (created on demand when ``create``)."""
        if self._meter is None:
            self._meter = self._find_or_create_meter(create)
        return self._meter

    def _find_or_create_meter(self, create: bool) -> str:
        self._limiter.acquire()
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
        self._limiter.acquire()
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

    def retrieve_invoice(self, invoice_id: str) -> dict[str, Any]:
        """The invoice as the pinned API version renders it."""
        self._limiter.acquire()
        invoice: dict[str, Any] = self._client.v1.invoices.retrieve(invoice_id).to_dict()
        return invoice

    def invoice_for(self, customer: str, moment: datetime) -> InvoiceView | None:
        """The customer's subscription invoice whose period holds ``moment``, if any."""
        self._limiter.acquire()
        page: Any = self._client.v1.invoices.list(params={"customer": customer, "limit": 100})
        stamp = int(moment.timestamp())
        for invoice in page.auto_paging_iter():
            if int(invoice.period_start) <= stamp < int(invoice.period_end):
                return self._view(invoice)
        return None

    def _view(self, invoice: Any) -> InvoiceView:
        data: dict[str, Any] = invoice.to_dict()
        lines = self._lines(data)
        line = self._metered_line(lines, self.meter_id())
        unit = Decimal(0)
        if line is not None:
            pricing = line.get("pricing") or {}
            unit = Decimal(str(pricing.get("unit_amount_decimal") or 0))
        return InvoiceView(
            id=str(data["id"]),
            status=str(data["status"]),
            currency=str(data["currency"]),
            amount_remaining=int(data["amount_remaining"]),
            line_id=None if line is None else str(line["id"]),
            unit_amount_minor=unit,
            line_quantity=0 if line is None else int(line.get("quantity") or 0),
            line_amount_minor=0 if line is None else int(line.get("amount") or 0),
            amount_paid=int(data.get("amount_paid") or 0),
        )

    def _lines(self, invoice: dict[str, Any]) -> list[dict[str, Any]]:
        """Every line of the invoice. Retrieved, an invoice holds "the first handful" of its
        lines and a URL for the rest (SDK docstring of ``invoices.line_items.list``): with
        several prices our meter's line may not be among them."""
        embedded = invoice.get("lines") or {}
        if not embedded.get("has_more"):
            return list(embedded.get("data") or [])
        self._limiter.acquire()
        page: Any = self._client.v1.invoices.line_items.list(
            str(invoice["id"]), params={"limit": 100}
        )
        return [line.to_dict() for line in page.auto_paging_iter()]

    def _metered_line(self, lines: list[dict[str, Any]], meter: str) -> dict[str, Any] | None:
        """The invoice line that bills ``meter``. Stripe ties a usage line to its meter only
        through the line's price (``pricing.price_details.price`` in the pinned API version,
        whose ``recurring.meter`` names the meter: "Create a price"); a subscription may
        have several prices, so the first line is not necessarily ours."""
        for line in lines:
            price = line_price(line)
            if price is not None and self._price_meter(price) == meter:
                return line
        return None

    def _price_meter(self, price: str | dict[str, Any]) -> str | None:
        """The meter a price bills (None for a licensed price). A price's ``recurring`` cannot
        change once created, so each price is retrieved once per gateway."""
        if isinstance(price, dict):  # expanded
            return (price.get("recurring") or {}).get("meter")
        if price not in self._price_meters:
            self._limiter.acquire()
            recurring = self._client.v1.prices.retrieve(price).to_dict().get("recurring") or {}
            self._price_meters[price] = recurring.get("meter")
        return self._price_meters[price]

    def credit_notes_of(self, invoice_id: str) -> list[CreditNoteView]:
        """Every credit note on the invoice, ours and others': a retry learns from them
        whether an earlier attempt took effect, and the next note what was refunded."""
        self._limiter.acquire()
        page: Any = self._client.v1.credit_notes.list(params={"invoice": invoice_id, "limit": 100})
        notes = []
        for note in page.auto_paging_iter():
            data = note.to_dict()
            refunds = data.get("refunds") or []
            notes.append(
                CreditNoteView(
                    id=str(data["id"]),
                    amount_minor=int(data["amount"]),
                    identifier=(data.get("metadata") or {}).get("fairmeter_identifier"),
                    refunded_minor=sum(int(r.get("amount_refunded") or 0) for r in refunds),
                )
            )
        return notes

    def create_credit_note(
        self,
        *,
        invoice: InvoiceView,
        amount_minor: int,
        refund_minor: int,
        credit_minor: int,
        identifier: str,
        metadata: dict[str, str],
        key: str,
    ) -> str:
        """A credit note of ``amount_minor`` on the invoice's metered line, in the invoice's
        currency. Stripe takes it off what the invoice still owes first (pre-payment); the
        rest must be split exactly into ``refund_minor`` and ``credit_minor`` (to the
        customer's balance in that currency) — "Create a credit note"."""
        line: dict[str, Any] = {
            "type": "custom_line_item",
            "unit_amount": amount_minor,
            "quantity": 1,
            "description": "Fairmeter usage correction",
        }
        if invoice.line_id is not None:
            line = {
                "type": "invoice_line_item",
                "invoice_line_item": invoice.line_id,
                "amount": amount_minor,
            }
        split = {"refund_amount": refund_minor, "credit_amount": credit_minor}
        self._limiter.acquire()
        note = self._client.v1.credit_notes.create(
            params={
                "invoice": invoice.id,
                "lines": [line],
                "reason": "order_change",
                "metadata": {**metadata, "fairmeter_identifier": identifier},
                **{name: value for name, value in split.items() if value},  # type: ignore[typeddict-item]
            },
            # A retry after the note was made sees a smaller amount owed, so another split:
            # Stripe refuses the key then (``used_with_other_parameters``) and the caller
            # looks the note up instead of issuing a second.
            options={"idempotency_key": key},
        )
        return str(note.id)

    def customer_invoices(self, customer: str) -> list[dict[str, Any]]:
        """Every invoice of the customer, newest first, as the pinned API version renders
        them ("List all invoices" — https://docs.stripe.com/api/invoices/list)."""
        self._limiter.acquire()
        page: Any = self._client.v1.invoices.list(params={"customer": customer, "limit": 100})
        return [invoice.to_dict() for invoice in page.auto_paging_iter()]

    def invoice_lines(self, invoice: dict[str, Any]) -> list[dict[str, Any]]:
        """All lines of ``invoice``: the invoice carries "the first handful" of its lines and
        the rest is paged from ``GET /v1/invoices/{id}/lines`` ("Retrieve an invoice's line
        items" — https://docs.stripe.com/api/invoice-line-item/retrieve), which the SDK calls
        ``invoices.line_items.list``. It is asked only when the embedded page says
        ``has_more`` (the emulator embeds every line and does not serve that path)."""
        rest = self._client.v1.invoices.line_items
        return self._whole_list(invoice.get("lines") or {}, rest, str(invoice["id"]))

    def metered_line_of(self, invoice: dict[str, Any]) -> dict[str, Any] | None:
        """The line of ``invoice`` that bills our meter (through its price), if any."""
        return self._metered_line(self.invoice_lines(invoice), self.meter_id())

    def credited_by_line(self, invoice_id: str) -> dict[str, int]:
        """Minor units credited per invoice line id by the invoice's credit notes that are not
        void ("The Credit Note Line Item object": ``invoice_line_item``, ``amount`` —
        https://docs.stripe.com/api/credit_notes/line_item). Lines beyond a note's embedded
        page are paged from ``credit_notes.line_items.list``; custom lines count under ``""``."""
        self._limiter.acquire()
        page: Any = self._client.v1.credit_notes.list(params={"invoice": invoice_id, "limit": 100})
        credited: dict[str, int] = {}
        for note in page.auto_paging_iter():
            data: dict[str, Any] = note.to_dict()
            if data.get("status") == "void":
                continue
            rest = self._client.v1.credit_notes.line_items
            for line in self._whole_list(data.get("lines") or {}, rest, str(data["id"])):
                key = str(line.get("invoice_line_item") or "")
                credited[key] = credited.get(key, 0) + int(line["amount"])
        return credited

    def _whole_list(self, embedded: dict[str, Any], rest: Any, parent: str) -> list[dict[str, Any]]:
        """An embedded list's items, then, when it ``has_more``, the items after them from
        ``rest`` (the SDK's service for the parent's sub-list, e.g. its line items)."""
        items: list[dict[str, Any]] = list(embedded.get("data") or [])
        if embedded.get("has_more") and items:
            self._limiter.acquire()
            page: Any = rest.list(
                parent, params={"limit": 100, "starting_after": str(items[-1]["id"])}
            )
            items += [item.to_dict() for item in page.auto_paging_iter()]
        return items


def line_price(line: dict[str, Any]) -> str | dict[str, Any] | None:
    """The price of an invoice line: ``pricing.price_details.price`` since API version
    2025-03-31.basil; a top-level ``price`` object before it."""
    details = (line.get("pricing") or {}).get("price_details") or {}
    price = details.get("price") or line.get("price")
    return price if isinstance(price, str | dict) else None


ALREADY_CANCELLED = "has already been canceled"


def already_cancelled(exc: Exception) -> bool:
    """Stripe refused a cancel of an event that is cancelled already: what a probe of a
    cancel hears when the first attempt landed. Stripe's reference documents no answer for a
    second cancel; these are the emulator's words (meter_events.py), matched loosely."""
    return isinstance(exc, stripe.InvalidRequestError) and ALREADY_CANCELLED in str(exc)
