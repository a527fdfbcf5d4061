"""Invoices per customer and UTC month: created at period end, finalized after the grace.

Stripe creates a subscription's invoice as a draft when the period ends and finalizes it after
the finalization grace period (default one hour); "during the finalization grace period, you
can continue to report usage for the previous billing period. When the invoice finalizes,
Stripe updates it to reflect the latest quantity for its billing period." After that the
invoice is final: later usage or cancellations dated in the period change the meter summaries
only, and an adjustment needs a credit note. See docs/stripe.md for the pages.

The cycle runs lazily (``run_cycle``) and is exact whenever it runs, because a line counts
only the events Stripe had received and not cancelled by ``automatically_finalizes_at``.
"""

from __future__ import annotations

from typing import Any

from devtools.stripe_emulator import destinations, webhooks
from devtools.stripe_emulator.billing_objects import Invoice, Subscription
from devtools.stripe_emulator.customers import CURRENCIES, find_customer, move_balance
from devtools.stripe_emulator.errors import invalid_request, resource_missing
from devtools.stripe_emulator.forms import Params
from devtools.stripe_emulator.invoice_lines import usage_lines
from devtools.stripe_emulator.lists import paginate
from devtools.stripe_emulator.params import check_known, optional_str
from devtools.stripe_emulator.periods import month_start, next_billing_date
from devtools.stripe_emulator.render_billing import current_lines, render_invoice, render_lines
from devtools.stripe_emulator.state import EmulatorState, new_id

STATUSES = frozenset({"draft", "open", "paid", "void"})


def subscribe(state: EmulatorState, spec: dict[str, Any]) -> Subscription:
    """Register (or replace) a customer's subscription from a control-API body."""
    with state.lock:
        customer = find_customer(state, str(spec.get("customer")))
        currency = str(spec.get("currency") or state.settings.default_currency).lower()
        if currency not in CURRENCIES:
            raise ValueError(f"currency must be one of {sorted(CURRENCIES)}")
        unit = spec.get("unit_amount", state.settings.unit_amount_minor)
        if not isinstance(unit, int) or isinstance(unit, bool) or unit < 0:
            raise ValueError("unit_amount must be a non-negative integer (minor units)")
        meters = spec.get("meters")
        for meter_id in meters or []:
            if meter_id not in state.meters:
                raise ValueError(f"no meter {meter_id!r}")
        now = state.clock.now()
        start = int(spec.get("start", now))
        subscription = Subscription(
            new_id("sub"), customer.id, currency, unit, month_start(start), now, meters
        )
        state.book.subscriptions[customer.id] = subscription
        return subscription


def note_usage(state: EmulatorState, customer_id: str, timestamp: int) -> None:
    """An accepted meter event: subscribe its customer automatically (lock held)."""
    if customer_id not in state.customers:
        return
    book, settings = state.book, state.settings
    subscription = book.subscriptions.get(customer_id)
    period = month_start(timestamp)
    if subscription is None and settings.auto_subscribe:
        book.subscriptions[customer_id] = Subscription(
            new_id("sub"),
            customer_id,
            settings.default_currency,
            settings.unit_amount_minor,
            period,
            state.clock.now(),
            automatic=True,
        )
    elif subscription is not None and subscription.automatic:
        subscription.first_period_start = min(subscription.first_period_start, period)


def run_cycle(state: EmulatorState) -> dict[str, list[str]]:
    """Create, finalize and (auto-)pay whatever is due at the emulator's now."""
    done: dict[str, list[str]] = {"created": [], "finalized": [], "paid": []}
    with state.lock:
        now = state.clock.now()
        for subscription in list(state.book.subscriptions.values()):
            _create_due_drafts(state, subscription, now, done)
        for invoice in sorted(state.book.invoices.values(), key=lambda i: i.created):
            if invoice.status == "draft" and invoice.automatically_finalizes_at <= now:
                _finalize(state, invoice, done)
            pay_after = state.settings.auto_pay_after_s
            if invoice.status == "open" and pay_after is not None:
                due_at = (invoice.finalized_at or 0) + pay_after
                if due_at <= now:
                    mark_paid(state, invoice, due_at, done)
    return done


def _create_due_drafts(
    state: EmulatorState, subscription: Subscription, now: int, done: dict[str, list[str]]
) -> None:
    book = state.book
    period_start = subscription.first_period_start
    while (period_end := next_billing_date(subscription.anchor, period_start)) <= now:
        key = (subscription.customer, period_start)
        if key not in book.invoice_by_period:
            invoice = _draft(state, subscription, period_start, period_end)
            book.invoices[invoice.id] = invoice
            book.invoice_by_period[key] = invoice.id
            done["created"].append(invoice.id)
            emit(state, "invoice.created", render_invoice(state, invoice), invoice.created)
        period_start = period_end


def _draft(
    state: EmulatorState, subscription: Subscription, period_start: int, period_end: int
) -> Invoice:
    invoice = Invoice(
        id=new_id("in"),
        number=f"{subscription.customer[-8:].upper()}-{len(state.book.invoices) + 1:04d}",
        customer=subscription.customer,
        subscription=subscription.id,
        currency=subscription.currency,
        period_start=period_start,
        period_end=period_end,
        created=period_end,
        automatically_finalizes_at=period_end + state.settings.finalization_grace_s,
        unit_amount_minor=subscription.unit_amount_minor,
        meters=subscription.meters,
        prices=subscription.prices,
    )
    invoice.lines = usage_lines(state, invoice, period_end)
    invoice.amount_due = invoice.amount_remaining = invoice.total
    return invoice


def _finalize(state: EmulatorState, invoice: Invoice, done: dict[str, list[str]]) -> None:
    """Freeze the lines, apply the balance in the invoice's currency, open the invoice."""
    at = invoice.automatically_finalizes_at
    invoice.lines = usage_lines(state, invoice, at)
    customer = state.customers.get(invoice.customer)  # None: deleted since the period
    balance = customer.balances.get(invoice.currency, 0) if customer else 0
    total = invoice.total
    # A credit (negative balance) covers at most the total; a debit is added in full.
    applied = -min(total, -balance) if balance < 0 else balance
    invoice.starting_balance = balance
    invoice.amount_due = total + applied
    invoice.ending_balance = balance - applied
    if applied and customer is not None:
        move_balance(
            state,
            customer,
            invoice.currency,
            -applied,
            kind="applied_to_invoice",
            invoice=invoice.id,
            created=at,
        )
    invoice.amount_remaining = invoice.amount_due
    invoice.status, invoice.finalized_at = "open", at
    done["finalized"].append(invoice.id)
    emit(state, "invoice.finalized", render_invoice(state, invoice), at)
    if invoice.amount_due == 0:
        mark_paid(state, invoice, at, done)


def mark_paid(
    state: EmulatorState, invoice: Invoice, at: int, done: dict[str, list[str]] | None = None
) -> None:
    """The remaining amount is collected (lock held); emits ``invoice.paid``."""
    invoice.amount_paid += invoice.amount_remaining
    invoice.amount_remaining = 0
    invoice.status, invoice.paid_at = "paid", at
    if done is not None:
        done["paid"].append(invoice.id)
    emit(state, "invoice.paid", render_invoice(state, invoice), at)


def emit(state: EmulatorState, event_type: str, data_object: dict[str, Any], at: int) -> None:
    """A v1 snapshot event dated ``at``, stored for ``/v1/events`` and queued for delivery."""
    event = webhooks.snapshot_event(state, event_type, data_object)
    event["created"] = at
    destinations.enqueue(state, "snapshot", event)


def find_invoice(state: EmulatorState, invoice_id: str, *, param: str = "id") -> Invoice:
    invoice = state.book.invoices.get(invoice_id)
    if invoice is None:
        raise resource_missing("invoice", invoice_id, param=param)
    return invoice


def retrieve_invoice(state: EmulatorState, invoice_id: str) -> dict[str, Any]:
    run_cycle(state)
    with state.lock:
        invoice = state.book.invoices.get(invoice_id)
        if invoice is not None:
            return render_invoice(state, invoice)
        legacy = state.invoices.get(invoice_id)  # made by POST /_emulator/webhooks
    if legacy is None:
        raise resource_missing("invoice", invoice_id)
    return legacy


def list_invoices(state: EmulatorState, params: Params) -> dict[str, Any]:
    """Newest first, filtered by ``customer``, ``status`` and ``subscription``."""
    check_known(
        params, {"customer", "status", "subscription", "limit", "starting_after", "ending_before"}
    )
    customer, status = optional_str(params, "customer"), optional_str(params, "status")
    subscription = optional_str(params, "subscription")
    if status is not None and status not in STATUSES | {"uncollectible"}:
        raise invalid_request(f"Invalid status: {status}", param="status")
    run_cycle(state)
    with state.lock:
        invoices = sorted(state.book.invoices.values(), key=lambda i: i.created, reverse=True)
        rows = [
            render_invoice(state, invoice)
            for invoice in invoices
            if (customer is None or invoice.customer == customer)
            and (status is None or invoice.status == status)
            and (subscription is None or invoice.subscription == subscription)
        ]
    return paginate(rows, params, "/v1/invoices")


def pay_invoice(state: EmulatorState, invoice_id: str, params: Params) -> dict[str, Any]:
    """``POST /v1/invoices/{id}/pay``: an open invoice becomes paid."""
    check_known(params, {"paid_out_of_band", "payment_method", "source", "forgive"})
    run_cycle(state)
    with state.lock:
        invoice = find_invoice(state, invoice_id)
        if invoice.status != "open":
            raise invalid_request(
                f"Invoice {invoice.id} is {invoice.status}; only an open invoice can be paid.",
            )
        mark_paid(state, invoice, state.clock.now())
        return render_invoice(state, invoice)


def void_invoice(state: EmulatorState, invoice_id: str, params: Params) -> dict[str, Any]:
    """``POST /v1/invoices/{id}/void``: "Mark a finalized invoice as void. This cannot be
    undone" (https://docs.stripe.com/api/invoices/void). The emulator voids only an open
    invoice (it has no uncollectible ones; a paid one is refused). Emits ``invoice.voided``."""
    check_known(params, set())
    run_cycle(state)
    with state.lock:
        invoice = find_invoice(state, invoice_id)
        if invoice.status != "open":
            raise invalid_request(
                f"You can only void open or uncollectible invoices; {invoice.id} is "
                f"{invoice.status}.",
            )
        invoice.status = "void"
        rendered = render_invoice(state, invoice)
        emit(state, "invoice.voided", rendered, state.clock.now())
        return rendered


def list_invoice_lines(state: EmulatorState, invoice_id: str, params: Params) -> dict[str, Any]:
    """``GET /v1/invoices/{id}/lines``: every line, a page at a time (``limit``,
    ``starting_after``, ``ending_before``); a draft shows today's usage."""
    check_known(params, {"limit", "starting_after", "ending_before"})
    run_cycle(state)
    with state.lock:
        invoice = find_invoice(state, invoice_id)
        rows = render_lines(invoice, current_lines(state, invoice))
    return paginate(rows, params, f"/v1/invoices/{invoice_id}/lines")
