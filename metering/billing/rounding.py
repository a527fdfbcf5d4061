"""Pure: the one place where ledger micros become what Stripe bills, and how it is rounded.

Two roundings stand between the ledger and an invoice, and each has one owner here:

1. **Micros → meter units** (``to_units``). Stripe's meter values and credited quantities
   are whole units of ``stripe_meter_unit_micros``. Every step of a customer's period — a
   meter event, a cancel, a credit note — goes through the same carry of that period, rounded
   down, so per customer and period Stripe bills exactly ⌊Σ ledger micros / unit⌋ units and
   the carry (0 ≤ carry < unit) is the remainder. It is never sent: when the period's invoice
   is finalized the remainder is forgiven, in the customer's favour, less than one unit per
   customer and period.
2. **Units → minor currency units** (``line_minor``, ``credit_note_minor``). Stripe prices a
   metered line as quantity × the price's ``unit_amount_decimal`` and rounds the line once
   to a whole minor unit. A credit note is an amount in minor units, so crediting each
   correction on its own rounds many times (1,000 credits of 0.4999 ¢ would each be 0 ¢).
   Instead a credit note's amount is the line's amount minus what the line is worth at its
   remaining quantity, minus what our earlier notes on the line already credited: whatever
   the order and size of the credits, invoice line − our notes = ``line_minor(net units)``,
   the line rounded once. A note that comes to 0 is not sent; the next one includes it.

The rounding mode of ``line_minor`` is half up, which is how the Stripe emulator prices
lines (devtools/stripe_emulator); see docs/stripe.md, "Rounding".
"""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal


def to_units(carry_micros: int, micros: int, unit_micros: int) -> tuple[int, int]:
    """``(units, carry after)``: whole units for ``micros`` (signed) on top of the carry,
    rounded down so the carry after is in ``[0, unit_micros)``."""
    if unit_micros <= 0:
        raise ValueError("a meter unit is a positive number of micros")
    return divmod(carry_micros + micros, unit_micros)


def line_minor(units: int, unit_amount_minor: Decimal) -> int:
    """What ``units`` of a metered line cost in the invoice's minor unit, rounded once."""
    return int((unit_amount_minor * units).to_integral_value(rounding=ROUND_HALF_UP))


def credit_note_minor(
    *,
    line_quantity: int,
    line_amount_minor: int,
    unit_amount_minor: Decimal,
    credited_units_before: int,
    credited_minor_before: int,
    units: int,
) -> int:
    """The amount of the credit note that credits ``units`` more of a line billed
    ``line_quantity`` units for ``line_amount_minor``, our earlier notes on it having
    credited ``credited_units_before`` units for ``credited_minor_before``: after it, the
    line net of our notes is worth ``line_minor(line_quantity − all credited units)``."""
    remaining = line_quantity - credited_units_before - units
    worth_after = line_minor(remaining, unit_amount_minor)
    return line_amount_minor - worth_after - credited_minor_before
