"""A second `make up` keeps the demo customers' Stripe links (issue #31 item 1).

`make up` runs the demo again on the same database and the same (persisted) emulator. It made
a new Stripe customer per demo customer each time, so the emulator held 11 customers for 5,
every earlier meter event sat on the old ids, and `fairmeter stripe drift` printed
differences the demo itself had made. The emulator here is real (HTTP, the official SDK).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from devtools.simulator.demo import link_to_emulator
from devtools.stripe_emulator import EmulatorServer
from tests.helpers.webhooks import customer

TENANT = "demo-tenant"
CUSTOMERS = ["demo-customer", "acme-robotics"]


@pytest.fixture
def emulator() -> Iterator[EmulatorServer]:
    server = EmulatorServer()
    server.start()
    yield server
    server.stop()


def emulator_customers(url: str) -> list[str]:
    state = httpx.get(f"{url}/_emulator/state", timeout=10).json()
    return sorted(row["id"] for row in state["customers"])


def linked(db: Any) -> dict[str, str]:
    rows = db.execute(
        "SELECT id, stripe_customer_id FROM customers WHERE tenant_id = %s", (TENANT,)
    ).fetchall()
    return dict(rows)


def test_a_second_demo_keeps_each_customer_s_stripe_link(settings, engine, db, emulator):
    for name in CUSTOMERS:
        customer(engine, TENANT, name)
    first = link_to_emulator(settings, TENANT, CUSTOMERS, emulator.url)
    assert linked(db) == first
    assert len(set(first.values())) == 2

    second = link_to_emulator(settings, TENANT, CUSTOMERS, emulator.url)

    assert second == first
    assert linked(db) == first
    assert emulator_customers(emulator.url) == sorted(first.values())  # no new customer


def test_a_link_the_emulator_no_longer_knows_is_made_again(settings, engine, db, emulator):
    """A fresh emulator state (its file removed) does not know the stored ids: each demo
    customer gets a new Stripe customer, linked, rather than a link to nothing."""
    for name in CUSTOMERS:
        customer(engine, TENANT, name)
    db.execute(
        "UPDATE customers SET stripe_customer_id = 'cus_gone' WHERE tenant_id = %s AND id = %s",
        (TENANT, CUSTOMERS[0]),
    )

    links = link_to_emulator(settings, TENANT, CUSTOMERS, emulator.url)

    assert links[CUSTOMERS[0]] != "cus_gone"
    assert linked(db) == links
    assert emulator_customers(emulator.url) == sorted(links.values())
