"""Tenants, their API keys and their customers."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from metering.models.base import tenant_primary_key, timestamp_field

KEY_SCOPES = ("ingest", "customer", "support", "admin")


class TenantRow(SQLModel, table=True):
    __tablename__ = "tenants"

    id: str = Field(primary_key=True, max_length=64)
    created_at: datetime | None = timestamp_field(default_now=True)


class ApiKeyRow(SQLModel, table=True):
    """An API key. Only an HMAC of the secret is kept; the key id is the lookup handle."""

    __tablename__ = "api_keys"
    __table_args__ = (
        tenant_primary_key("key_id"),
        sa.CheckConstraint(
            "scope IN ('ingest', 'customer', 'support', 'admin')", name="scope_known"
        ),
        sa.CheckConstraint(
            "(scope = 'customer') = (customer_id IS NOT NULL)", name="customer_scope_names_customer"
        ),
    )

    key_id: str = Field(primary_key=True, max_length=32)
    tenant_id: str = Field(foreign_key="tenants.id", max_length=64, primary_key=True, index=True)
    scope: str = Field(max_length=16)
    customer_id: str | None = Field(default=None, max_length=128)
    secret_hmac: str = Field(max_length=64)
    label: str | None = Field(default=None, max_length=200)
    created_at: datetime | None = timestamp_field(default_now=True)
    expires_at: datetime | None = timestamp_field(nullable=True)
    revoked_at: datetime | None = timestamp_field(nullable=True)


class CustomerRow(SQLModel, table=True):
    """A tenant's customer, created on its first event.

    Its billing rate — the invoice's currency and the Stripe price of one meter unit in it,
    in minor units, exactly as Stripe gives it — converts ledger micros into what its invoice
    says (docs/stripe.md, "Currency"); NULL until learned, stored whole, the latest wins."""

    __tablename__ = "customers"
    __table_args__ = (
        sa.CheckConstraint(
            "(billing_currency IS NULL) = (billing_unit_amount_decimal IS NULL) "
            "AND (billing_currency IS NULL) = (billing_rate_since IS NULL)",
            name="billing_rate_whole",
        ),
        sa.CheckConstraint(
            "billing_currency ~ '^[a-z]{3}$' AND billing_unit_amount_decimal >= 0",
            name="billing_currency_iso",
        ),
    )

    tenant_id: str = Field(foreign_key="tenants.id", primary_key=True, max_length=64)
    id: str = Field(primary_key=True, max_length=128)
    stripe_customer_id: str | None = Field(default=None, max_length=255)
    created_at: datetime | None = timestamp_field(default_now=True)
    billing_currency: str | None = Field(default=None, max_length=3)  # ISO 4217, lowercase
    billing_unit_amount_decimal: Decimal | None = Field(
        default=None, sa_column=sa.Column(sa.Numeric(), nullable=True)
    )
    billing_rate_since: datetime | None = timestamp_field(nullable=True)


class ConsoleSessionRow(SQLModel, table=True):
    """A support-console sign-in. The cookie holds a random token; only its SHA-256 is kept,
    so a copy of this table opens no session. Sign-out deletes the row; a revoked or expired
    key ends its sessions because every request reads the session joined to its key."""

    __tablename__ = "console_sessions"
    __table_args__ = (
        tenant_primary_key("token_sha256"),
        sa.Index("ix_console_sessions_key_id", "key_id"),
        sa.ForeignKeyConstraint(["tenant_id", "key_id"], ["api_keys.tenant_id", "api_keys.key_id"]),
    )

    token_sha256: str = Field(primary_key=True, max_length=64)
    # The key's tenant, copied so the session's keys can include it (issue #18).
    tenant_id: str = Field(max_length=64, primary_key=True)
    key_id: str = Field(max_length=32)
    created_at: datetime | None = timestamp_field(default_now=True)
    expires_at: datetime | None = timestamp_field()
