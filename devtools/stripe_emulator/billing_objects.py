"""The emulator's billing objects: subscriptions, invoices, credit notes, event destinations.

Plain dataclasses guarded by ``EmulatorState.lock``; ``invoicing``, ``credit_notes`` and
``destinations`` hold the behaviour. ``Book`` is the whole billing side of the state.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from decimal import ROUND_HALF_UP, Decimal
from typing import Any


def minor_units(quantity: int, unit_amount_decimal: str) -> int:
    """``quantity`` × a price's ``unit_amount_decimal`` (minor units, up to 12 decimals) as a
    whole number of minor units. Stripe documents no rounding mode for this product; half-up
    is the emulator's choice (and the one Fairmeter's gateway uses)."""
    exact = Decimal(quantity) * Decimal(unit_amount_decimal)
    return int(exact.to_integral_value(rounding=ROUND_HALF_UP))


@dataclass
class Price:
    """A price; a metered one names the meter it bills (``recurring[meter]``)."""

    id: str
    currency: str
    unit_amount_decimal: str
    product: str
    created: int
    interval: str = "month"
    usage_type: str = "metered"
    meter: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)


@dataclass
class Subscription:
    """What a customer is billed for: its ``prices`` (``POST /v1/subscriptions``), or every
    meter (or ``meters``) at one unit amount (the control API's shortcut); billed monthly
    from ``billing_cycle_anchor``, the first period starting at ``first_period_start``."""

    id: str
    customer: str
    currency: str
    unit_amount_minor: int
    first_period_start: int
    created: int
    meters: list[str] | None = None
    automatic: bool = False
    billing_cycle_anchor: int | None = None  # None: the first period's start
    prices: list[str] | None = None

    @property
    def anchor(self) -> int:
        if self.billing_cycle_anchor is None:
            return self.first_period_start
        return self.billing_cycle_anchor


@dataclass
class InvoiceLine:
    id: str
    meter: str
    price: str  # how Stripe ties the line to its meter: the price's recurring[meter]
    product: str
    quantity: int
    unit_amount_decimal: str  # the price's, fractions of a minor unit allowed
    period_start: int
    period_end: int
    description: str

    @property
    def amount(self) -> int:
        return minor_units(self.quantity, self.unit_amount_decimal)


@dataclass
class Invoice:
    id: str
    number: str
    customer: str
    subscription: str
    currency: str
    period_start: int
    period_end: int
    created: int
    automatically_finalizes_at: int
    unit_amount_minor: int
    meters: list[str] | None = None  # None: every meter
    prices: list[str] | None = None  # the subscription's prices, when it names them
    status: str = "draft"  # draft → open → paid
    lines: list[InvoiceLine] = field(default_factory=list)
    starting_balance: int = 0
    ending_balance: int | None = None
    amount_due: int = 0
    amount_paid: int = 0
    amount_remaining: int = 0
    pre_payment_credit_notes_amount: int = 0
    post_payment_credit_notes_amount: int = 0
    finalized_at: int | None = None
    paid_at: int | None = None

    @property
    def total(self) -> int:
        return sum(line.amount for line in self.lines)


@dataclass
class CreditNote:
    id: str
    number: str
    invoice: str
    customer: str
    currency: str
    amount: int
    pre_payment_amount: int
    post_payment_amount: int
    credit_amount: int
    refund_amount: int
    out_of_band_amount: int
    created: int
    lines: list[dict[str, Any]]
    reason: str | None = None
    memo: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    customer_balance_transaction: str | None = None

    @property
    def type(self) -> str:
        if self.pre_payment_amount and self.post_payment_amount:
            return "mixed"
        return "post_payment" if self.post_payment_amount else "pre_payment"


@dataclass
class Destination:
    """An event destination: its own URL, signing secret and payload style."""

    id: str
    url: str
    secret: str
    style: str  # "snapshot" (v1 events) or "thin" (v2 notifications)
    name: str | None = None
    types: list[str] | None = None  # None: every event of its style
    # Snapshot events are rendered in the endpoint's API version (None: the account default).
    api_version: str | None = None

    def wants(self, style: str, event_type: str) -> bool:
        return self.style == style and (self.types is None or event_type in self.types)

    def describe(self) -> dict[str, Any]:
        row = asdict(self)
        row["secret"] = "***"  # noqa: S105 - a mask, not a secret
        return row


@dataclass
class Book:
    subscriptions: dict[str, Subscription] = field(default_factory=dict)  # by customer
    invoices: dict[str, Invoice] = field(default_factory=dict)
    invoice_by_period: dict[tuple[str, int], str] = field(default_factory=dict)
    credit_notes: dict[str, CreditNote] = field(default_factory=dict)
    prices: dict[str, Price] = field(default_factory=dict)
    destinations: list[Destination] = field(default_factory=list)
    # (style, event payload): queued until delivered, never delivered from an API request.
    outbox: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    event_deliveries: list[dict[str, Any]] = field(default_factory=list)

    def snapshot(self) -> dict[str, Any]:
        return {
            "subscriptions": [asdict(sub) for sub in self.subscriptions.values()],
            "invoices": [_invoice_row(invoice) for invoice in self.invoices.values()],
            "credit_notes": [asdict(note) for note in self.credit_notes.values()],
            "prices": [asdict(price) for price in self.prices.values()],
            "destinations": [dest.describe() for dest in self.destinations],
            "pending_deliveries": [event["id"] for _, event in self.outbox],
            "event_deliveries": list(self.event_deliveries),
        }


def _invoice_row(invoice: Invoice) -> dict[str, Any]:
    row = asdict(invoice)
    row["total"] = invoice.total
    return row
