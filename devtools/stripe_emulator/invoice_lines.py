"""The metered lines of an invoice: each meter's aggregate over the period at one instant."""

from __future__ import annotations

from devtools.stripe_emulator.billing_objects import Invoice, InvoiceLine, Price
from devtools.stripe_emulator.meters import aggregate
from devtools.stripe_emulator.prices import metered_price
from devtools.stripe_emulator.state import EmulatorState


def usage_lines(state: EmulatorState, invoice: Invoice, at: int) -> list[InvoiceLine]:
    """One line per billed price: its meter's aggregate over the period as Stripe held it at
    ``at``. A subscription that names no prices bills every meter (or its ``meters``) at the
    meter's price in the invoice's currency."""
    if invoice.prices is not None:
        prices = [state.book.prices[price_id] for price_id in invoice.prices]
    else:
        meter_ids = invoice.meters if invoice.meters is not None else list(state.meters)
        prices = [
            state.book.prices[
                metered_price(state, meter_id, invoice.currency, invoice.unit_amount_minor)
            ]
            for meter_id in meter_ids
        ]
    return [_line(state, invoice, price, at) for price in prices if price.meter is not None]


def _line(state: EmulatorState, invoice: Invoice, price: Price, at: int) -> InvoiceLine:
    meter_id = str(price.meter)
    meter = state.meters[meter_id]
    events = [
        event
        for event in state.events_by_series.get((meter_id, invoice.customer), ())
        if invoice.period_start <= event.timestamp < invoice.period_end and event.counts_at(at)
    ]
    return InvoiceLine(
        id=f"il_{invoice.id[3:]}_{meter_id[4:12]}",
        meter=meter_id,
        price=price.id,
        product=price.product,
        # Stripe bills a negative cycle total (negative events allowed) as quantity 0.
        quantity=max(0, aggregate(meter.formula, events)),
        unit_amount_decimal=price.unit_amount_decimal,
        period_start=invoice.period_start,
        period_end=invoice.period_end,
        description=meter.display_name,
    )
