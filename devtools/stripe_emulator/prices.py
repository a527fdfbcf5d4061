"""Prices (``/v1/prices``): how Stripe ties a metered invoice line to its meter.

A usage-based price is ``recurring[usage_type]=metered`` with ``recurring[meter]`` naming the
meter it bills ("Create a price", "Set up a pay-as-you-go pricing model"); a subscription
item holds the price, and each invoice line names it under ``pricing.price_details.price``
(the API version the SDK pins). Nothing on the line names the meter itself, so a client
with several prices learns which line is its meter's only through the price.

A subscription created without prices (the emulator's control API, or its automatic one)
gets one metered price per meter, made on first use, as a Dashboard setup would hold.
"""

from __future__ import annotations

from typing import Any

from devtools.stripe_emulator.billing_objects import Price
from devtools.stripe_emulator.customers import CURRENCIES
from devtools.stripe_emulator.errors import invalid_request, resource_missing
from devtools.stripe_emulator.forms import Params
from devtools.stripe_emulator.lists import paginate
from devtools.stripe_emulator.params import check_known, hash_param, optional_str, string_map
from devtools.stripe_emulator.state import EmulatorState, new_id

USAGE_TYPES = frozenset({"licensed", "metered"})
INTERVALS = frozenset({"day", "week", "month", "year"})


def create_price(state: EmulatorState, params: Params) -> dict[str, Any]:
    check_known(
        params,
        {"currency", "unit_amount", "unit_amount_decimal", "product", "product_data"}
        | {"recurring", "metadata", "nickname", "billing_scheme"},
    )
    currency = (optional_str(params, "currency") or "").lower()
    if currency not in CURRENCIES:
        raise invalid_request(f"Invalid currency: {currency}", param="currency")
    amount = optional_str(params, "unit_amount_decimal") or optional_str(params, "unit_amount")
    if amount is None or not _decimal(amount):
        raise invalid_request("Missing required param: unit_amount.", param="unit_amount")
    recurring = hash_param(params, "recurring")
    usage_type = optional_str(recurring, "usage_type") or "licensed"
    interval = optional_str(recurring, "interval") or "month"
    meter = optional_str(recurring, "meter")
    if usage_type not in USAGE_TYPES or interval not in INTERVALS:
        raise invalid_request("Invalid recurring parameters.", param="recurring")
    with state.lock:
        if meter is not None and meter not in state.meters:
            raise invalid_request(f"No such meter: '{meter}'", param="recurring[meter]")
        if usage_type == "metered" and meter is None:
            raise invalid_request(
                "A metered price requires recurring[meter].", param="recurring[meter]"
            )
        price = Price(
            id=new_id("price"),
            currency=currency,
            unit_amount_decimal=amount,
            product=optional_str(params, "product") or new_id("prod"),
            created=state.clock.now(),
            interval=interval,
            usage_type=usage_type,
            meter=meter,
            metadata=string_map(params, "metadata"),
        )
        state.book.prices[price.id] = price
        return render_price(price)


def retrieve_price(state: EmulatorState, price_id: str) -> dict[str, Any]:
    with state.lock:
        price = state.book.prices.get(price_id)
        if price is None:
            raise resource_missing("price", price_id)
        return render_price(price)


def list_prices(state: EmulatorState, params: Params) -> dict[str, Any]:
    check_known(params, {"limit", "starting_after", "ending_before", "currency", "active"})
    currency = optional_str(params, "currency")
    with state.lock:
        prices = sorted(state.book.prices.values(), key=lambda p: p.created, reverse=True)
        rows = [render_price(p) for p in prices if currency in (None, p.currency)]
    return paginate(rows, params, "/v1/prices")


def metered_price(state: EmulatorState, meter_id: str, currency: str, unit_minor: int) -> str:
    """The id of a metered price billing ``meter_id`` in ``currency`` (lock held); made on
    first use for subscriptions that were set up without naming prices."""
    for price in state.book.prices.values():
        if price.meter == meter_id and price.currency == currency:
            return price.id
    price = Price(new_id("price"), currency, str(unit_minor), new_id("prod"), state.clock.now())
    price.meter = meter_id
    state.book.prices[price.id] = price
    return price.id


def render_price(price: Price) -> dict[str, Any]:
    return {
        "id": price.id,
        "object": "price",
        "active": True,
        "billing_scheme": "per_unit",
        "created": price.created,
        "currency": price.currency,
        "livemode": False,
        "metadata": dict(price.metadata),
        "product": price.product,
        "recurring": {
            "interval": price.interval,
            "interval_count": 1,
            "meter": price.meter,
            "usage_type": price.usage_type,
        },
        "type": "recurring",
        "unit_amount": _whole(price.unit_amount_decimal),
        "unit_amount_decimal": price.unit_amount_decimal,
    }


def _decimal(text: str) -> bool:
    """A non-negative decimal "with at most 12 decimal places" ("Create a price",
    https://docs.stripe.com/api/prices/create)."""
    head, _, tail = text.partition(".")
    return head.isdigit() and (tail == "" or (tail.isdigit() and len(tail) <= 12))


def _whole(text: str) -> int | None:
    return int(text) if text.isdigit() else None
