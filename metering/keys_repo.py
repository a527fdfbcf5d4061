"""Storage of tenants and API keys."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from metering.errors import bad_request, not_found
from metering.ids import IdKind, id_problem
from metering.keys import Scope, generate_key, key_hmac


@dataclass(frozen=True, slots=True)
class StoredKey:
    key_id: str
    tenant_id: str
    scope: Scope
    customer_id: str | None
    secret_hmac: str
    expires_at: datetime | None
    revoked_at: datetime | None


def ensure_tenant(conn: psycopg.Connection[Any], tenant_id: str) -> None:
    conn.execute("INSERT INTO tenants (id) VALUES (%s) ON CONFLICT DO NOTHING", (tenant_id,))


def create_key(
    conn: psycopg.Connection[Any],
    *,
    tenant_id: str,
    scope: Scope,
    pepper: str,
    customer_id: str | None = None,
    label: str | None = None,
    expires_at: datetime | None = None,
) -> tuple[str, str]:
    """Create a key (and its tenant, and customer, when new); returns ``(key_id, raw key)``.

    The raw key is returned once and never stored.
    """
    if (scope is Scope.CUSTOMER) != (customer_id is not None):
        raise bad_request("customer keys, and only they, name a customer", code="invalid_key_spec")
    # Tenants and customers follow the grammar ingest holds run and customer ids to.
    for value, kind in ((tenant_id, IdKind.TENANT), (customer_id, IdKind.CUSTOMER)):
        problem = None if value is None else id_problem(value, kind)
        if problem:
            raise bad_request(f"{problem}: {value!r}", code="invalid_id")
    ensure_tenant(conn, tenant_id)
    if customer_id is not None:
        conn.execute(
            "INSERT INTO customers (tenant_id, id) VALUES (%s, %s) ON CONFLICT DO NOTHING",
            (tenant_id, customer_id),
        )
    key = generate_key(scope)
    conn.execute(
        "INSERT INTO api_keys (key_id, tenant_id, scope, customer_id, secret_hmac, label, "
        "expires_at) VALUES (%s, %s, %s, %s, %s, %s, %s)",
        (
            key.key_id,
            tenant_id,
            scope.value,
            customer_id,
            key_hmac(key.raw, pepper),
            label,
            expires_at,
        ),
    )
    return key.key_id, key.raw


def find_key(conn: psycopg.Connection[Any], key_id: str) -> StoredKey | None:
    row = conn.execute(
        "SELECT key_id, tenant_id, scope, customer_id, secret_hmac, expires_at, revoked_at "
        "FROM api_keys WHERE key_id = %s",
        (key_id,),
    ).fetchone()
    if row is None:
        return None
    return StoredKey(row[0], row[1], Scope(row[2]), row[3], row[4], row[5], row[6])


def revoke_key(conn: psycopg.Connection[Any], key_id: str) -> None:
    result = conn.execute(
        "UPDATE api_keys SET revoked_at = now() WHERE key_id = %s AND revoked_at IS NULL",
        (key_id,),
    )
    if result.rowcount == 0 and find_key(conn, key_id) is None:
        raise not_found(f"no key {key_id}", code="key_not_found")
