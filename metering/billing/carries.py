"""The carries' storage (``stripe_carries``): each customer's sub-unit remainder per period
(metering/billing/rounding.py), read and locked by the planner, moved back when an unsent
plan is dropped or Stripe rejects an event."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

CustomerKey = tuple[str, str]  # tenant, customer


def lock(
    conn: psycopg.Connection[Any], keys: Sequence[CustomerKey]
) -> dict[CustomerKey, dict[str, int]]:
    """Every period's carry of the customers ``keys``, locked until commit (one lock order
    for everyone: sorted). A period without a row has a carry of 0."""
    wanted = sorted(set(keys))
    rows = conn.execute(
        "SELECT tenant_id, customer_id, period, carry_micros FROM stripe_carries "
        "WHERE (tenant_id, customer_id) IN (SELECT * FROM unnest(%s::text[], %s::text[])) "
        "ORDER BY tenant_id, customer_id, period FOR UPDATE",
        ([k[0] for k in wanted], [k[1] for k in wanted]),
    ).fetchall()
    found: dict[CustomerKey, dict[str, int]] = {key: {} for key in wanted}
    for tenant, customer, period, micros in rows:
        found[(tenant, customer)][period] = int(micros)
    return found


def save(conn: psycopg.Connection[Any], carries: dict[CustomerKey, dict[str, int]]) -> None:
    """Write the customers' carries as planning left them."""
    _upsert(
        conn,
        [(t, c, p, micros) for (t, c), by in carries.items() for p, micros in by.items()],
        add=False,
    )


def add(conn: psycopg.Connection[Any], tenant: str, customer: str, moved: dict[str, int]) -> None:
    """Add ``moved`` (period → micros) to the customer's carries (a row made if new)."""
    if moved:
        _upsert(conn, [(tenant, customer, p, m) for p, m in moved.items()], add=True)


def _upsert(
    conn: psycopg.Connection[Any], rows: Sequence[tuple[str, str, str, int]], *, add: bool
) -> None:
    rows = sorted(rows)
    value = "EXCLUDED.carry_micros"
    if add:
        value = f"stripe_carries.carry_micros + {value}"
    conn.execute(
        "INSERT INTO stripe_carries (tenant_id, customer_id, period, carry_micros) "
        "SELECT * FROM unnest(%s::text[], %s::text[], %s::text[], %s::bigint[]) "
        f"ON CONFLICT (tenant_id, customer_id, period) DO UPDATE SET carry_micros = {value}",
        tuple([r[i] for r in rows] for i in range(4)),
    )
