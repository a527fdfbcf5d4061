"""Customers and their balance transactions (``/v1/customers...``)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from devtools.stripe_emulator.errors import invalid_request, resource_missing
from devtools.stripe_emulator.forms import Params
from devtools.stripe_emulator.lists import paginate
from devtools.stripe_emulator.params import (
    check_known,
    optional_int,
    optional_str,
    required_int,
    required_str,
    string_map,
)
from devtools.stripe_emulator.state import BalanceTransaction, Customer, EmulatorState, new_id

CURRENCIES = frozenset({"usd", "eur", "gbp"})


def create_customer(state: EmulatorState, params: Params) -> dict[str, Any]:
    check_known(params, {"email", "name", "description", "metadata", "balance", "id"})
    with state.lock:
        customer = Customer(
            id=optional_str(params, "id") or new_id("cus"),
            created=state.clock.now(),
            email=optional_str(params, "email"),
            name=optional_str(params, "name"),
            description=optional_str(params, "description"),
            metadata=string_map(params, "metadata"),
            balance=optional_int(params, "balance") or 0,
        )
        if customer.id in state.customers:
            raise invalid_request(
                f"Customer already exists: '{customer.id}'",
                param="id",
                code="resource_already_exists",
            )
        state.customers[customer.id] = customer
        state.balance_transactions[customer.id] = []
        return render_customer(customer)


def retrieve_customer(state: EmulatorState, customer_id: str) -> dict[str, Any]:
    with state.lock:
        return render_customer(_find(state, customer_id))


def list_customers(state: EmulatorState, params: Params) -> dict[str, Any]:
    check_known(params, {"limit", "starting_after", "ending_before", "email"})
    email = optional_str(params, "email")
    with state.lock:
        customers = sorted(state.customers.values(), key=lambda c: c.created, reverse=True)
        rows = [render_customer(c) for c in customers if email is None or c.email == email]
    return paginate(rows, params, "/v1/customers")


def render_customer(customer: Customer) -> dict[str, Any]:
    return {
        "id": customer.id,
        "object": "customer",
        "balance": customer.balance,
        "created": customer.created,
        "currency": customer.currency,
        "delinquent": False,
        "description": customer.description,
        "email": customer.email,
        # Stripe's sign here is the opposite of ``balance``: positive is a credit.
        "invoice_credit_balance": {cur: -value for cur, value in customer.balances.items()},
        "invoice_prefix": customer.id[-8:].upper(),
        "livemode": False,
        "metadata": dict(customer.metadata),
        "name": customer.name,
    }


def create_balance_transaction(
    state: EmulatorState, customer_id: str, params: Params
) -> dict[str, Any]:
    """An immutable adjustment of the balance in ``currency``; negative is a credit.

    Stripe keeps one balance per currency: a credit in one currency is applied only to the
    next invoice in that currency. The first currency used becomes the customer's default,
    which ``balance`` reports; ``invoice_credit_balance`` lists them all.
    """
    check_known(params, {"amount", "currency", "description", "metadata"})
    amount = required_int(params, "amount")
    currency = required_str(params, "currency").lower()
    if currency not in CURRENCIES:
        raise invalid_request(f"Invalid currency: {currency}", param="currency")
    with state.lock:
        customer = _find(state, customer_id)
        txn = move_balance(
            state,
            customer,
            currency,
            amount,
            description=optional_str(params, "description"),
            metadata=string_map(params, "metadata"),
        )
        return render_balance_transaction(txn)


def delete_customer(state: EmulatorState, customer_id: str) -> dict[str, Any]:
    """``DELETE /v1/customers/{id}``: "Permanently deletes a customer. It cannot be undone.
    Also immediately cancels any active subscriptions on the customer"
    (https://docs.stripe.com/api/customers/delete). Later meter events naming it fail
    validation with ``meter_event_customer_not_found``."""
    with state.lock:
        customer = _find(state, customer_id)
        del state.customers[customer.id]
        state.book.subscriptions.pop(customer.id, None)
    return {"id": customer.id, "object": "customer", "deleted": True}


def move_balance(
    state: EmulatorState,
    customer: Customer,
    currency: str,
    amount: int,
    *,
    kind: str = "adjustment",
    invoice: str | None = None,
    credit_note: str | None = None,
    description: str | None = None,
    metadata: dict[str, str] | None = None,
    created: int | None = None,
) -> BalanceTransaction:
    """Record one balance transaction and move that currency's balance (lock held)."""
    if customer.currency is None:
        customer.currency = currency
    ending = customer.balances.get(currency, 0) + amount
    customer.balances[currency] = ending
    if currency == customer.currency:
        customer.balance = ending
    txn = BalanceTransaction(
        id=new_id("cbtxn"),
        customer=customer.id,
        amount=amount,
        currency=currency,
        created=state.clock.now() if created is None else created,
        ending_balance=ending,
        description=description,
        metadata=metadata or {},
        type=kind,
        invoice=invoice,
        credit_note=credit_note,
    )
    state.balance_transactions[customer.id].append(txn)
    return txn


def list_balance_transactions(
    state: EmulatorState, customer_id: str, params: Params
) -> dict[str, Any]:
    check_known(params, {"limit", "starting_after", "ending_before"})
    with state.lock:
        customer = _find(state, customer_id)
        rows = [render_balance_transaction(t) for t in state.balance_transactions[customer.id]]
    rows.reverse()  # newest first, as Stripe lists them
    return paginate(rows, params, f"/v1/customers/{customer_id}/balance_transactions")


def render_balance_transaction(txn: BalanceTransaction) -> dict[str, Any]:
    row = asdict(txn)
    row.update(object="customer_balance_transaction", livemode=False)
    return row


def find_customer(state: EmulatorState, customer_id: str) -> Customer:
    """The customer, or Stripe's 404 ``resource_missing`` (lock held)."""
    return _find(state, customer_id)


def _find(state: EmulatorState, customer_id: str) -> Customer:
    customer = state.customers.get(customer_id)
    if customer is None:
        raise resource_missing("customer", customer_id)
    return customer
