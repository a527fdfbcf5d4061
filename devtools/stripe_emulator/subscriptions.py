"""``POST /v1/subscriptions`` and ``GET /v1/subscriptions/{id}``: what a customer is billed for.

Stripe bills no one without a subscription; a subscription's invoices follow its billing-cycle
anchor, whose "default value is either the subscription creation date or the trial end date"
and which may be set explicitly at creation ("Set the subscription billing renewal date",
https://docs.stripe.com/billing/subscriptions/billing-cycle). The first period runs from
creation to the anchor when the anchor is later; full monthly periods follow it.
The emulator holds one subscription per customer, with metered prices of one currency.
"""

from __future__ import annotations

from typing import Any

from devtools.stripe_emulator.billing_objects import Subscription
from devtools.stripe_emulator.customers import find_customer
from devtools.stripe_emulator.errors import invalid_request, missing_param, resource_missing
from devtools.stripe_emulator.forms import Params
from devtools.stripe_emulator.params import check_known, optional_int, required_str, string_map
from devtools.stripe_emulator.periods import current_period
from devtools.stripe_emulator.prices import render_price
from devtools.stripe_emulator.state import EmulatorState, new_id

KNOWN = {"customer", "items", "billing_cycle_anchor", "metadata", "collection_method"}


def create_subscription(state: EmulatorState, params: Params) -> dict[str, Any]:
    check_known(params, KNOWN)
    customer_id = required_str(params, "customer")
    anchor = optional_int(params, "billing_cycle_anchor")
    string_map(params, "metadata")
    with state.lock:
        customer = find_customer(state, customer_id)
        price_ids = _item_prices(state, params.get("items"))
        currencies = {state.book.prices[p].currency for p in price_ids}
        if len(currencies) != 1:
            raise invalid_request("All prices on a subscription must have the same currency.")
        now = state.clock.now()
        if anchor is not None and anchor < now:
            raise invalid_request(
                "billing_cycle_anchor cannot be in the past.", param="billing_cycle_anchor"
            )
        if customer.id in state.book.subscriptions:
            raise invalid_request(
                "The Stripe emulator holds one subscription per customer.", param="customer"
            )
        subscription = Subscription(
            id=new_id("sub"),
            customer=customer.id,
            currency=currencies.pop(),
            unit_amount_minor=0,  # unused: the prices carry the amounts
            first_period_start=now,
            created=now,
            billing_cycle_anchor=now if anchor is None else anchor,
            prices=price_ids,
        )
        state.book.subscriptions[customer.id] = subscription
        return render_subscription(state, subscription)


def retrieve_subscription(state: EmulatorState, subscription_id: str) -> dict[str, Any]:
    with state.lock:
        for subscription in state.book.subscriptions.values():
            if subscription.id == subscription_id:
                return render_subscription(state, subscription)
    raise resource_missing("subscription", subscription_id)


def _item_prices(state: EmulatorState, items: Any) -> list[str]:
    if not isinstance(items, list) or not items:
        raise missing_param("items")
    price_ids = []
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise invalid_request(f"Invalid object: items[{index}]", param=f"items[{index}]")
        price_id = required_str(item, "price", label=f"items[{index}][price]")
        price = state.book.prices.get(price_id)
        if price is None:
            raise resource_missing("price", price_id, param=f"items[{index}][price]", status=400)
        price_ids.append(price_id)
    return price_ids


def render_subscription(state: EmulatorState, subscription: Subscription) -> dict[str, Any]:
    period_start, period_end = current_period(
        subscription.anchor, subscription.first_period_start, state.clock.now()
    )
    items = [
        {
            "id": f"si_{price_id[6:]}",
            "object": "subscription_item",
            "current_period_start": period_start,
            "current_period_end": period_end,
            "price": render_price(state.book.prices[price_id]),
            "subscription": subscription.id,
        }
        for price_id in subscription.prices or []
    ]
    return {
        "id": subscription.id,
        "object": "subscription",
        "billing_cycle_anchor": subscription.anchor,
        "created": subscription.created,
        "currency": subscription.currency,
        "customer": subscription.customer,
        "items": {"object": "list", "data": items, "has_more": False, "total_count": len(items)},
        "livemode": False,
        "start_date": subscription.first_period_start,
        "status": "active",
    }
