"""Invoices, their lines and credit notes in Stripe's JSON shape (API version clover)."""

from __future__ import annotations

from typing import Any

from devtools.stripe_emulator.billing_objects import CreditNote, Invoice, InvoiceLine
from devtools.stripe_emulator.invoice_lines import usage_lines
from devtools.stripe_emulator.lists import paginate
from devtools.stripe_emulator.state import EmulatorState


def render_invoice(state: EmulatorState, invoice: Invoice) -> dict[str, Any]:
    """The invoice as ``GET /v1/invoices/{id}`` returns it; a draft shows today's usage."""
    lines = current_lines(state, invoice)
    total = sum(line.amount for line in lines)
    amount_due = total if invoice.status == "draft" else invoice.amount_due
    remaining = total if invoice.status == "draft" else invoice.amount_remaining
    return {
        "id": invoice.id,
        "object": "invoice",
        "amount_due": amount_due,
        "amount_overpaid": 0,
        "amount_paid": invoice.amount_paid,
        "amount_remaining": remaining,
        "attempt_count": 0,
        "auto_advance": invoice.status == "draft",
        "automatically_finalizes_at": (
            invoice.automatically_finalizes_at if invoice.status == "draft" else None
        ),
        "billing_reason": "subscription_cycle",
        "collection_method": "charge_automatically",
        "created": invoice.created,
        "currency": invoice.currency,
        "customer": invoice.customer,
        "description": None,
        "ending_balance": invoice.ending_balance,
        # Embedded lists hold the first page only (Stripe's default page size);
        # GET /v1/invoices/{id}/lines pages through the rest.
        "lines": {
            **paginate(render_lines(invoice, lines), {}, f"/v1/invoices/{invoice.id}/lines"),
            "total_count": len(lines),
        },
        "livemode": False,
        "metadata": {},
        "number": None if invoice.status == "draft" else invoice.number,
        "parent": {
            "type": "subscription_details",
            "quote_details": None,
            "subscription_details": {"metadata": {}, "subscription": invoice.subscription},
        },
        "period_end": invoice.period_end,
        "period_start": invoice.period_start,
        "post_payment_credit_notes_amount": invoice.post_payment_credit_notes_amount,
        "pre_payment_credit_notes_amount": invoice.pre_payment_credit_notes_amount,
        "starting_balance": invoice.starting_balance,
        "status": invoice.status,
        "status_transitions": {
            "finalized_at": invoice.finalized_at,
            "marked_uncollectible_at": None,
            "paid_at": invoice.paid_at,
            "voided_at": None,
        },
        "subtotal": total,
        "subtotal_excluding_tax": total,
        "total": total,
        "total_discount_amounts": [],
        "total_excluding_tax": total,
        "total_taxes": [],
    }


def _render_line(invoice: Invoice, line: InvoiceLine) -> dict[str, Any]:
    return {
        "id": line.id,
        "object": "line_item",
        "amount": line.amount,
        "currency": invoice.currency,
        "description": line.description,
        "discount_amounts": [],
        "discountable": True,
        "discounts": [],
        "invoice": invoice.id,
        "livemode": False,
        # Nothing here names the meter: Stripe links a line to it through the price.
        "metadata": {},
        "parent": {
            "type": "subscription_item_details",
            "invoice_item_details": None,
            "subscription_item_details": {
                "invoice_item": None,
                "proration": False,
                "proration_details": {"credited_items": None},
                "subscription": invoice.subscription,
                "subscription_item": f"si_{line.price[6:]}",
            },
        },
        "period": {"end": line.period_end, "start": line.period_start},
        "pretax_credit_amounts": [],
        "pricing": {
            "type": "price_details",
            "price_details": {"price": line.price, "product": line.product},
            "unit_amount_decimal": line.unit_amount_decimal,
        },
        "quantity": line.quantity,
        "subtotal": line.amount,
        "taxes": [],
    }


def current_lines(state: EmulatorState, invoice: Invoice) -> list[InvoiceLine]:
    """The final lines, or for a draft today's usage."""
    if invoice.status == "draft":
        return usage_lines(state, invoice, state.clock.now())
    return invoice.lines


def render_lines(invoice: Invoice, lines: list[InvoiceLine]) -> list[dict[str, Any]]:
    return [_render_line(invoice, line) for line in lines]


def render_credit_note(note: CreditNote) -> dict[str, Any]:
    return {
        "id": note.id,
        "object": "credit_note",
        "amount": note.amount,
        "amount_shipping": 0,
        "created": note.created,
        "currency": note.currency,
        "customer": note.customer,
        "customer_balance_transaction": note.customer_balance_transaction,
        "discount_amount": 0,
        "discount_amounts": [],
        "effective_at": note.created,
        "invoice": note.invoice,
        "lines": {
            "object": "list",
            "data": [dict(line) for line in note.lines],
            "has_more": False,
            "url": f"/v1/credit_notes/{note.id}/lines",
        },
        "livemode": False,
        "memo": note.memo,
        "metadata": dict(note.metadata),
        "number": note.number,
        "out_of_band_amount": note.out_of_band_amount or None,
        "pdf": "",
        "post_payment_amount": note.post_payment_amount,
        "pre_payment_amount": note.pre_payment_amount,
        "pretax_credit_amounts": [],
        "reason": note.reason,
        "refunds": (
            [
                {
                    "amount_refunded": note.refund_amount,
                    "refund": f"re_{note.id[3:]}",
                    "type": "refund",
                }
            ]
            if note.refund_amount
            else []
        ),
        "status": "issued",
        "subtotal": note.amount,
        "subtotal_excluding_tax": note.amount,
        "total": note.amount,
        "total_excluding_tax": note.amount,
        "total_taxes": [],
        "type": note.type,
        "voided_at": None,
    }
