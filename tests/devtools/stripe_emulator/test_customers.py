"""Customer balance transactions move the customer's balance."""

from __future__ import annotations

import pytest
import stripe


def test_balance_transactions_change_the_customer_balance(
    client: stripe.StripeClient, customer: stripe.Customer
) -> None:
    credit = client.v1.customers.balance_transactions.create(
        customer.id,
        params={
            "amount": -1250,
            "currency": "usd",
            "description": "Refund of run r1",
            "metadata": {"run_id": "r1"},
        },
    )
    client.v1.customers.balance_transactions.create(
        customer.id, params={"amount": 200, "currency": "usd"}
    )

    assert (credit.object, credit.ending_balance) == ("customer_balance_transaction", -1250)
    assert credit.metadata["run_id"] == "r1"
    assert client.v1.customers.retrieve(customer.id).balance == -1050
    listed = client.v1.customers.balance_transactions.list(customer.id)
    assert [t.amount for t in listed.auto_paging_iter()] == [200, -1250]


def test_balance_transaction_for_an_unknown_customer_is_resource_missing(
    client: stripe.StripeClient,
) -> None:
    with pytest.raises(stripe.InvalidRequestError) as raised:
        client.v1.customers.balance_transactions.create(
            "cus_missing", params={"amount": -1, "currency": "usd"}
        )
    assert (raised.value.http_status, raised.value.code) == (404, "resource_missing")


def test_customer_list_paginates_with_starting_after(client: stripe.StripeClient) -> None:
    created = [client.v1.customers.create(params={"name": f"c{i}"}).id for i in range(5)]

    first = client.v1.customers.list(params={"limit": 2})
    every = [c.id for c in client.v1.customers.list(params={"limit": 2}).auto_paging_iter()]

    assert first.has_more is True and len(first.data) == 2
    assert sorted(every) == sorted(created)
