"""Disputes and the audit log of every support action."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB
from sqlmodel import Field, SQLModel

from metering.models.base import (
    month_key_field,
    tenant_id_field,
    tenant_primary_key,
    timestamp_field,
)


class DisputeRow(SQLModel, table=True):
    """A customer's claim about a run, and how support resolved it."""

    __tablename__ = "disputes"
    __table_args__ = (
        sa.CheckConstraint("status IN ('open', 'approved', 'rejected')", name="status_known"),
        sa.CheckConstraint("credit_micros >= 0", name="credit_not_negative"),
        sa.Index("ix_disputes_tenant_id_status", "tenant_id", "status"),
        sa.Index("ix_disputes_run_id", "run_id"),
        tenant_primary_key("id"),
        sa.ForeignKeyConstraint(["tenant_id", "run_id"], ["runs.tenant_id", "runs.id"]),
    )

    id: int | None = tenant_id_field()
    tenant_id: str = Field(max_length=64, primary_key=True)
    customer_id: str = Field(max_length=128)
    run_id: int = Field(sa_type=sa.BigInteger)
    status: str = Field(max_length=16)
    claim: str = Field(sa_column=sa.Column(sa.Text, nullable=False))
    opened_by: str = Field(max_length=128)
    opened_at: datetime | None = timestamp_field(default_now=True)
    resolved_by: str | None = Field(default=None, max_length=128)
    resolved_at: datetime | None = timestamp_field(nullable=True)
    resolution_reason: str | None = Field(default=None, sa_column=sa.Column(sa.Text))
    credit_micros: int = Field(
        default=0, sa_column=sa.Column(sa.BigInteger, nullable=False, server_default="0")
    )
    decision_version: int | None = Field(default=None)


class SupportCreditRow(SQLModel, table=True):
    """One credit support granted on a run: an amount of the usage the run had at the time.

    Append-only, like the ledger. ``covers_line_id`` is the run's highest usage line id
    when the credit was granted; settlement applies the credit only to the billed part of
    those lines, so usage that arrives later is settled by policy, never by an old credit.
    (Ingest locks the run row before it allocates line ids, and a grant holds that lock, so
    every later line of the run has a higher id.) ``grant_no`` numbers a run's credits: two
    credits that were not serialised on the run would collide on it.
    """

    __tablename__ = "support_credits"
    __table_args__ = (
        tenant_primary_key("id"),
        sa.UniqueConstraint("run_id", "grant_no", "tenant_id"),
        sa.CheckConstraint("amount_micros > 0", name="amount_positive"),
        sa.CheckConstraint("grant_no >= 1 AND covers_line_id >= 0", name="numbers_valid"),
        # The per-customer daily limit sums a customer's credits of one UTC day.
        sa.Index(
            "ix_support_credits_tenant_id_customer_id_granted_at",
            "tenant_id",
            "customer_id",
            "granted_at",
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id", "customer_id", "run_id"],
            ["runs.tenant_id", "runs.customer_id", "runs.id"],
        ),
    )

    id: int | None = tenant_id_field()
    tenant_id: str = Field(max_length=64, primary_key=True)
    customer_id: str = Field(max_length=128)
    run_id: int = Field(sa_type=sa.BigInteger)
    grant_no: int = Field(sa_column=sa.Column(sa.Integer, nullable=False))
    amount_micros: int = Field(sa_column=sa.Column(sa.BigInteger, nullable=False))
    covers_line_id: int = Field(sa_column=sa.Column(sa.BigInteger, nullable=False))
    granted_by: str = Field(max_length=128)
    granted_by_scope: str = Field(max_length=16)
    granted_at: datetime = Field(sa_column=sa.Column(sa.DateTime(timezone=True), nullable=False))


class AuditRow(SQLModel, table=True):
    """Append-only (the database refuses UPDATE and DELETE): who did what, why, and the
    amounts before and after."""

    __tablename__ = "audit_log"
    __table_args__ = (
        # Partitioned by month of created_at (migration 0023): the key must include it.
        sa.PrimaryKeyConstraint("id", "tenant_id", "created_at"),
        sa.Index("ix_audit_log_tenant_id_created_at", "tenant_id", "created_at"),
    )

    id: int | None = tenant_id_field()
    tenant_id: str = Field(max_length=64, primary_key=True)
    actor: str = Field(max_length=128)
    actor_scope: str = Field(max_length=16)
    action: str = Field(max_length=64)
    target_type: str = Field(max_length=32)
    target_id: str = Field(max_length=200)
    reason: str | None = Field(default=None, sa_column=sa.Column(sa.Text))
    before: dict[str, Any] | None = Field(default=None, sa_column=sa.Column(JSONB))
    after: dict[str, Any] | None = Field(default=None, sa_column=sa.Column(JSONB))
    # Part of the key: the table is partitioned by month of it (migration 0023).
    created_at: datetime | None = month_key_field(default_now=True)
