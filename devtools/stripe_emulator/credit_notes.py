"""Credit notes (``/v1/credit_notes``): the documented way to adjust a finalized invoice.

"A credit note will first reduce the invoice's amount_remaining (and amount_due), but not
below zero. This amount is indicated by the credit note's pre_payment_amount. The excess
amount is indicated by post_payment_amount" — which must be split exactly into
``refund_amount``, ``credit_amount`` (to the customer's balance, in the invoice's currency)
and ``out_of_band_amount``. Only finalized invoices take credit notes, and all of an invoice's
credit notes together cannot exceed its total.
"""

from __future__ import annotations

from typing import Any

from devtools.stripe_emulator.billing_objects import CreditNote, Invoice, minor_units
from devtools.stripe_emulator.customers import move_balance
from devtools.stripe_emulator.errors import invalid_request, missing_param, resource_missing
from devtools.stripe_emulator.forms import Params
from devtools.stripe_emulator.invoicing import emit, find_invoice, mark_paid, run_cycle
from devtools.stripe_emulator.lists import paginate
from devtools.stripe_emulator.params import (
    check_known,
    optional_int,
    optional_str,
    parse_int,
    required_str,
    string_map,
)
from devtools.stripe_emulator.render_billing import render_credit_note
from devtools.stripe_emulator.state import EmulatorState, new_id

REASONS = frozenset({"duplicate", "fraudulent", "order_change", "product_unsatisfactory"})
CREATE_PARAMS = {
    "invoice",
    "amount",
    "lines",
    "reason",
    "memo",
    "metadata",
    "credit_amount",
    "refund_amount",
    "out_of_band_amount",
    "effective_at",
    "email_type",
}


def create_credit_note(state: EmulatorState, params: Params) -> dict[str, Any]:
    check_known(params, CREATE_PARAMS)
    invoice_id = required_str(params, "invoice")
    reason = optional_str(params, "reason")
    if reason is not None and reason not in REASONS:
        raise invalid_request(
            f"Invalid reason: must be one of {', '.join(sorted(REASONS))}", param="reason"
        )
    split = {name: optional_int(params, name) or 0 for name in _SPLIT}
    run_cycle(state)
    with state.lock:
        invoice = find_invoice(state, invoice_id, param="invoice")
        if invoice.status not in {"open", "paid"}:
            raise invalid_request(
                f"Invoice {invoice.id} is {invoice.status}; credit notes can only be issued "
                "for finalized (open or paid) invoices.",
                param="invoice",
            )
        amount, lines = _amount_and_lines(invoice, params)
        _check_creditable(state, invoice, amount)
        _check_lines_creditable(state, invoice, lines)
        pre = min(amount, invoice.amount_remaining)
        _check_split(state, invoice, amount - pre, split)
        note = CreditNote(
            id=new_id("cn"),
            number=f"{invoice.number}-CN-{len(_notes_of(state, invoice.id)) + 1:02d}",
            invoice=invoice.id,
            customer=invoice.customer,
            currency=invoice.currency,
            amount=amount,
            pre_payment_amount=pre,
            post_payment_amount=amount - pre,
            credit_amount=split["credit_amount"],
            refund_amount=split["refund_amount"],
            out_of_band_amount=split["out_of_band_amount"],
            created=state.clock.now(),
            lines=lines,
            reason=reason,
            memo=optional_str(params, "memo"),
            metadata=string_map(params, "metadata"),
        )
        _apply(state, invoice, note)
        rendered = render_credit_note(note)
        emit(state, "credit_note.created", rendered, note.created)
        return rendered


_SPLIT = ("credit_amount", "refund_amount", "out_of_band_amount")


def _amount_and_lines(invoice: Invoice, params: Params) -> tuple[int, list[dict[str, Any]]]:
    raw_lines = params.get("lines")
    amount = optional_int(params, "amount")
    if raw_lines is None:
        if amount is None:
            raise missing_param("amount")
        lines = [_line(invoice, "custom_line_item", amount, 1, amount, None, "Credit")]
    else:
        if not isinstance(raw_lines, list) or not raw_lines:
            raise invalid_request("Invalid array: lines", param="lines")
        lines = [_parse_line(invoice, index, raw) for index, raw in enumerate(raw_lines)]
        from_lines = sum(line["amount"] for line in lines)
        if amount is not None and amount != from_lines:
            raise invalid_request(
                f"The credit note amount ({amount}) must equal the sum of its lines "
                f"({from_lines}).",
                param="amount",
            )
        amount = from_lines
    if amount <= 0:
        raise invalid_request("The credit note amount must be greater than 0.", param="amount")
    return amount, lines


def _parse_line(invoice: Invoice, index: int, raw: Any) -> dict[str, Any]:
    label = f"lines[{index}]"
    if not isinstance(raw, dict):
        raise invalid_request(f"Invalid object: {label}", param=label)
    kind = required_str(raw, "type", label=f"{label}[type]")
    quantity = parse_int(raw.get("quantity", "1"), f"{label}[quantity]")
    if kind == "invoice_line_item":
        line_id = required_str(raw, "invoice_line_item", label=f"{label}[invoice_line_item]")
        billed = next((line for line in invoice.lines if line.id == line_id), None)
        if billed is None:
            raise resource_missing(
                "invoice line item", line_id, param=f"{label}[invoice_line_item]"
            )
        if "amount" in raw:
            amount = parse_int(raw["amount"], f"{label}[amount]")
        else:
            amount = minor_units(quantity, billed.unit_amount_decimal)
        return _line(invoice, kind, amount, quantity, None, line_id, billed.description)
    if kind == "custom_line_item":
        unit = parse_int(raw.get("unit_amount"), f"{label}[unit_amount]")
        description = required_str(raw, "description", label=f"{label}[description]")
        return _line(invoice, kind, unit * quantity, quantity, unit, None, description)
    raise invalid_request(
        f"Invalid {label}[type]: must be one of custom_line_item, invoice_line_item",
        param=f"{label}[type]",
    )


def _line(
    invoice: Invoice,
    kind: str,
    amount: int,
    quantity: int,
    unit_amount: int | None,
    invoice_line_item: str | None,
    description: str,
) -> dict[str, Any]:
    return {
        "id": new_id("cnli"),
        "object": "credit_note_line_item",
        "amount": amount,
        "description": description,
        "discount_amount": 0,
        "discount_amounts": [],
        "invoice_line_item": invoice_line_item,
        "livemode": False,
        "quantity": quantity,
        "type": kind,
        "unit_amount": unit_amount,
        "unit_amount_decimal": None if unit_amount is None else str(unit_amount),
    }


def _check_creditable(state: EmulatorState, invoice: Invoice, amount: int) -> None:
    credited = sum(note.amount for note in _notes_of(state, invoice.id))
    if credited + amount > invoice.total:
        raise invalid_request(
            f"The credit note amount ({amount}) is greater than the amount that can still be "
            f"credited on invoice {invoice.id} ({invoice.total - credited}).",
            param="amount",
        )


def _check_lines_creditable(
    state: EmulatorState, invoice: Invoice, lines: list[dict[str, Any]]
) -> None:
    """A credit on an invoice line may not take it below zero: its amount less what earlier
    credit notes (and this one's other lines) credited on it."""
    credited: dict[str, int] = {}
    for note in _notes_of(state, invoice.id):
        for line in note.lines:
            if line["invoice_line_item"]:
                credited[line["invoice_line_item"]] = (
                    credited.get(line["invoice_line_item"], 0) + line["amount"]
                )
    for line in lines:
        line_id = line["invoice_line_item"]
        if line_id is None:
            continue
        billed = next(billed.amount for billed in invoice.lines if billed.id == line_id)
        credited[line_id] = credited.get(line_id, 0) + line["amount"]
        if credited[line_id] > billed:
            raise invalid_request(
                f"The amount to credit on invoice line item {line_id} ({line['amount']}) is "
                f"greater than what can still be credited on it "
                f"({billed - credited[line_id] + line['amount']}).",
                param="lines",
            )


def _check_split(
    state: EmulatorState, invoice: Invoice, post_payment: int, split: dict[str, int]
) -> None:
    if any(value < 0 for value in split.values()):
        raise invalid_request("credit, refund and out-of-band amounts must not be negative.")
    if sum(split.values()) != post_payment:
        raise invalid_request(
            f"The sum of credit_amount, refund_amount and out_of_band_amount "
            f"({sum(split.values())}) must equal the credit note's post_payment_amount "
            f"({post_payment}): the part of the credit note above the invoice's "
            "amount_remaining.",
        )
    refunded = sum(note.refund_amount for note in _notes_of(state, invoice.id))
    if split["refund_amount"] > invoice.amount_paid - refunded:
        raise invalid_request(
            f"refund_amount ({split['refund_amount']}) is greater than the amount paid and not "
            f"yet refunded on invoice {invoice.id} ({invoice.amount_paid - refunded}).",
            param="refund_amount",
        )


def _apply(state: EmulatorState, invoice: Invoice, note: CreditNote) -> None:
    invoice.amount_due -= note.pre_payment_amount
    invoice.amount_remaining -= note.pre_payment_amount
    invoice.pre_payment_credit_notes_amount += note.pre_payment_amount
    invoice.post_payment_credit_notes_amount += note.post_payment_amount
    if note.credit_amount:
        txn = move_balance(
            state,
            state.customers[invoice.customer],
            invoice.currency,
            -note.credit_amount,
            kind="credit_note",
            invoice=invoice.id,
            credit_note=note.id,
            created=note.created,
        )
        note.customer_balance_transaction = txn.id
    state.book.credit_notes[note.id] = note
    if invoice.status == "open" and invoice.amount_remaining == 0:
        mark_paid(state, invoice, note.created)


def _notes_of(state: EmulatorState, invoice_id: str) -> list[CreditNote]:
    return [note for note in state.book.credit_notes.values() if note.invoice == invoice_id]


def retrieve_credit_note(state: EmulatorState, note_id: str) -> dict[str, Any]:
    with state.lock:
        note = state.book.credit_notes.get(note_id)
        if note is None:
            raise resource_missing("credit note", note_id)
        return render_credit_note(note)


def list_credit_notes(state: EmulatorState, params: Params) -> dict[str, Any]:
    check_known(params, {"invoice", "customer", "limit", "starting_after", "ending_before"})
    invoice, customer = optional_str(params, "invoice"), optional_str(params, "customer")
    with state.lock:
        # Newest first; among equal ``created``, the later one first.
        newest = reversed(list(state.book.credit_notes.values()))
        notes = sorted(newest, key=lambda n: n.created, reverse=True)
        rows = [
            render_credit_note(note)
            for note in notes
            if (invoice is None or note.invoice == invoice)
            and (customer is None or note.customer == customer)
        ]
    return paginate(rows, params, "/v1/credit_notes")
