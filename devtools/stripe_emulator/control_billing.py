"""Control endpoints for the billing side: subscriptions, the invoicing cycle, destinations.

See README.md ("Control API") for bodies and answers. Each returns JSON-ready data or raises
``ValueError`` (→ 400) / ``LookupError`` (→ 404); ``None`` means "not a billing route".
"""

from __future__ import annotations

import re
from dataclasses import asdict
from typing import Any

from devtools.stripe_emulator import destinations, invoicing, validation
from devtools.stripe_emulator.render_billing import render_invoice
from devtools.stripe_emulator.state import EmulatorState

_PAY = re.compile(r"/invoices/([A-Za-z0-9_]+)/pay")


def dispatch(state: EmulatorState, method: str, route: str, data: dict[str, Any]) -> Any:
    if (method, route) == ("POST", "/subscriptions"):
        return asdict(invoicing.subscribe(state, data))
    if (method, route) == ("POST", "/invoicing/run"):
        return {**run_due(state), "deliveries": destinations.flush(state)}
    paying = _PAY.fullmatch(route)
    if method == "POST" and paying:
        return _pay(state, paying.group(1))
    if (method, route) == ("POST", "/destinations"):
        return destinations.add_destination(state, data)
    if (method, route) == ("GET", "/destinations"):
        with state.lock:
            return {"data": [d.describe() for d in state.book.destinations]}
    if (method, route) == ("DELETE", "/destinations"):
        with state.lock:
            state.book.destinations.clear()
        return {"data": []}
    if (method, route) == ("POST", "/deliveries/flush"):
        return {"deliveries": destinations.flush(state)}
    if (method, route) == ("POST", "/validation/report"):
        return {"reports": validation.issue_due_reports(state, force=True)}
    return None


def run_due(state: EmulatorState) -> dict[str, list[str]]:
    """Whatever is due at the emulator's now: invoices created, finalized, paid; reports."""
    done = invoicing.run_cycle(state)
    return {**done, "reports": validation.issue_due_reports(state)}


def _pay(state: EmulatorState, invoice_id: str) -> dict[str, Any]:
    invoicing.run_cycle(state)
    with state.lock:
        invoice = state.book.invoices.get(invoice_id)
        if invoice is None:
            raise LookupError(f"no invoice {invoice_id!r}")
        if invoice.status != "open":
            raise ValueError(f"invoice {invoice_id} is {invoice.status}, not open")
        invoicing.mark_paid(state, invoice, state.clock.now())
        return render_invoice(state, invoice)
