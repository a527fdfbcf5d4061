"""Issuing the credit note a plan asks for, on the finalized invoice of the step's period.

"Issue a credit note to adjust the amount of a finalized invoice" ("Create a credit note"):
Stripe refuses credit notes on drafts, so a step whose invoice is not final yet waits; one
whose period ended long ago without any invoice (the customer has no subscription in Stripe)
cannot succeed and is dead-lettered. The credit note is looked up before it is created, so
a retry after a lost reply records the one Stripe has instead of issuing a second.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from metering.billing.gateway import (
    CreditNoteView,
    InvoiceView,
    StripeGateway,
    used_with_other_parameters,
)
from metering.billing.outbox import OutboxItem
from metering.billing.plan import Step, month_end
from metering.billing.rounding import credit_note_minor
from metering.config import Settings

# How long after a period's expected finalization a missing invoice is taken as never coming.
NO_INVOICE_AFTER = timedelta(days=1)


class InvoiceNotFinal(Exception):
    """The invoice of the step's period is a draft, or not created yet: wait for it."""


class NoInvoice(Exception):
    """No invoice was ever made for the step's period: a credit note cannot be issued."""


class NoMeteredLine(NoInvoice):
    """The invoice has no line whose price bills our meter: the amount per unit is unknown,
    and crediting another price's line would be wrong. Dead-lettered for an operator."""


class InvoiceVoid(NoInvoice):
    """The invoice was voided: Stripe takes no credit note on it, and it bills nothing."""


@dataclass(frozen=True, slots=True)
class Issued:
    note_id: str | None  # None: the amount came to 0 minor units and nothing was sent
    invoice_id: str
    currency: str
    amount_minor: int


@dataclass(frozen=True, slots=True)
class Credited:
    """What our earlier credit notes took off one invoice line (our deliveries' record)."""

    units: int = 0
    minor: int = 0


def payment_split(
    amount_minor: int, invoice: InvoiceView, refunded_minor: int, after_payment: str
) -> tuple[int, int]:
    """``(refund, credit to balance)`` of a credit note's post-payment part.

    Stripe lowers what the invoice still owes first; the rest "must equal the
    post_payment_amount" split into refunds, balance credits and out-of-band credits
    ("Create a credit note"), and a refund cannot exceed what the customer paid by charge
    and was not refunded yet. What the customer's credit balance paid (``amount_paid``
    leaves it out) or what can no longer be refunded goes back to the balance, in the
    invoice's currency."""
    post_payment = max(0, amount_minor - invoice.amount_remaining)
    refund = 0
    if after_payment == "refund":
        refund = min(post_payment, max(0, invoice.amount_paid - refunded_minor))
    return refund, post_payment - refund


def issue(
    gateway: StripeGateway,
    settings: Settings,
    item: OutboxItem,
    step: Step,
    key: str,
    now: datetime,
    credited_on: Callable[[str], Credited],
    *,
    look_first: bool = False,
) -> Issued:
    """The credit note for ``step`` (``step.units`` meter units), issued at most once, for
    the amount the one rounding rule gives (``rounding.credit_note_minor``) after what our
    earlier notes on the invoice (``credited_on(invoice id)``) took.

    At most once: the idempotency key covers a retry within Stripe's 24 h; a retry whose
    parameters changed because the first attempt executed (the invoice then owes less, so
    the split differs) is refused as a key "used with other parameters" and the note is
    looked up instead; past the window (``look_first``) it is looked up before anything."""
    invoice = _final_invoice(gateway, settings, item, step, now)
    notes = gateway.credit_notes_of(invoice.id) if look_first else None
    if notes is not None and (found := _ours(notes, step, invoice)) is not None:
        return found
    credited = credited_on(invoice.id)
    amount = credit_note_minor(
        line_quantity=invoice.line_quantity,
        line_amount_minor=invoice.line_amount_minor,
        unit_amount_minor=invoice.unit_amount_minor,
        credited_units_before=credited.units,
        credited_minor_before=credited.minor,
        units=step.units,
    )
    if amount <= 0:  # below one minor unit: a later note includes it
        return Issued(None, invoice.id, invoice.currency, 0)
    after_payment = settings.stripe_credit_note_after_payment
    if notes is None and amount > invoice.amount_remaining and after_payment == "refund":
        notes = gateway.credit_notes_of(invoice.id)  # what was refunded already
    refunded = sum(n.refunded_minor for n in notes or [])
    refund, to_balance = payment_split(amount, invoice, refunded, after_payment)
    metadata = {
        "run_id": str(item.run_id),
        "decision_version": str(item.version),
        "fairmeter_units": str(step.units),
    }
    try:
        note = gateway.create_credit_note(
            invoice=invoice,
            amount_minor=amount,
            refund_minor=refund,
            credit_minor=to_balance,
            identifier=step.identifier,
            metadata=metadata,
            key=key,
        )
    except Exception as exc:
        if not used_with_other_parameters(exc):
            raise
        found = _ours(gateway.credit_notes_of(invoice.id), step, invoice)
        if found is None:
            raise
        return found
    return Issued(note, invoice.id, invoice.currency, amount)


def _ours(notes: list[CreditNoteView], step: Step, invoice: InvoiceView) -> Issued | None:
    found = next((n for n in notes if n.identifier == step.identifier), None)
    if found is None:
        return None
    return Issued(found.id, invoice.id, invoice.currency, found.amount_minor)


def _final_invoice(
    gateway: StripeGateway, settings: Settings, item: OutboxItem, step: Step, now: datetime
) -> InvoiceView:
    """The finalized invoice of the step's period, or why there is none (yet)."""
    moment = datetime.fromtimestamp(step.timestamp, UTC)
    invoice = gateway.invoice_for(item.stripe_customer_id, moment)
    if invoice is None:
        expected = month_end(moment) + timedelta(seconds=settings.stripe_finalization_grace_s)
        if now > expected + NO_INVOICE_AFTER:
            raise NoInvoice(f"no Stripe invoice for the period of {moment.isoformat()}")
        raise InvoiceNotFinal(f"waiting for the invoice of {moment.isoformat()} to be created")
    if invoice.status == "draft":
        raise InvoiceNotFinal(f"waiting for invoice {invoice.id} to be finalized")
    if invoice.status == "void":
        raise InvoiceVoid(f"invoice {invoice.id} is void: it bills nothing to credit")
    if invoice.line_id is None:
        raise NoMeteredLine(f"invoice {invoice.id} has no line priced on our meter")
    return invoice
