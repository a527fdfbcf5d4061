"""Issuing the credit note a plan asks for, on the finalized invoice of the step's period.

"Issue a credit note to adjust the amount of a finalized invoice" ("Create a credit note"):
Stripe refuses credit notes on drafts, so a step whose invoice is not final yet waits; one
whose period ended long ago without any invoice (the customer has no subscription in Stripe)
cannot succeed and is dead-lettered. The credit note is looked up before it is created, so
a retry after a lost reply records the one Stripe has instead of issuing a second.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from metering.billing.gateway import StripeGateway, minor_amount
from metering.billing.outbox import OutboxItem
from metering.billing.plan import Step, month_end
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


@dataclass(frozen=True, slots=True)
class Issued:
    note_id: str
    invoice_id: str
    currency: str
    amount_minor: int


def issue(
    gateway: StripeGateway,
    settings: Settings,
    item: OutboxItem,
    step: Step,
    key: str,
    now: datetime,
) -> Issued:
    """The credit note for ``step`` (``step.units`` meter units), issued at most once."""
    moment = datetime.fromtimestamp(step.timestamp, UTC)
    invoice = gateway.invoice_for(item.stripe_customer_id, moment)
    if invoice is None:
        expected = month_end(moment) + timedelta(seconds=settings.stripe_finalization_grace_s)
        if now > expected + NO_INVOICE_AFTER:
            raise NoInvoice(f"no Stripe invoice for the period of {moment.isoformat()}")
        raise InvoiceNotFinal(f"waiting for the invoice of {moment.isoformat()} to be created")
    if invoice.status == "draft":
        raise InvoiceNotFinal(f"waiting for invoice {invoice.id} to be finalized")
    if invoice.line_id is None:
        raise NoMeteredLine(f"invoice {invoice.id} has no line priced on our meter")
    found = gateway.find_credit_note(invoice.id, step.identifier)
    if found is not None:
        return Issued(found[0], invoice.id, invoice.currency, found[1])
    amount = minor_amount(step.units, invoice.unit_amount_minor)
    note = gateway.create_credit_note(
        invoice=invoice,
        amount_minor=amount,
        after_payment=settings.stripe_credit_note_after_payment,
        identifier=step.identifier,
        metadata={"run_id": str(item.run_id), "decision_version": str(item.version)},
        key=key,
    )
    return Issued(note, invoice.id, invoice.currency, amount)
