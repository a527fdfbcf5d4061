"""Disputes and the audit log of every support action."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB
from sqlmodel import Field, SQLModel

from metering.models.base import timestamp_field


class DisputeRow(SQLModel, table=True):
    """A customer's claim about a run, and how support resolved it."""

    __tablename__ = "disputes"
    __table_args__ = (
        sa.CheckConstraint("status IN ('open', 'approved', 'rejected')", name="status_known"),
        sa.CheckConstraint("credit_micros >= 0", name="credit_not_negative"),
        sa.Index("ix_disputes_tenant_id_status", "tenant_id", "status"),
        sa.Index("ix_disputes_run_id", "run_id"),
    )

    id: int | None = Field(default=None, primary_key=True, sa_type=sa.BigInteger)
    tenant_id: str = Field(max_length=64)
    customer_id: str = Field(max_length=128)
    run_id: int = Field(foreign_key="runs.id", sa_type=sa.BigInteger)
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


class AuditRow(SQLModel, table=True):
    """Append-only (the database refuses UPDATE and DELETE): who did what, why, and the
    amounts before and after."""

    __tablename__ = "audit_log"
    __table_args__ = (sa.Index("ix_audit_log_tenant_id_created_at", "tenant_id", "created_at"),)

    id: int | None = Field(default=None, primary_key=True, sa_type=sa.BigInteger)
    tenant_id: str = Field(max_length=64)
    actor: str = Field(max_length=128)
    actor_scope: str = Field(max_length=16)
    action: str = Field(max_length=64)
    target_type: str = Field(max_length=32)
    target_id: str = Field(max_length=200)
    reason: str | None = Field(default=None, sa_column=sa.Column(sa.Text))
    before: dict[str, Any] | None = Field(default=None, sa_column=sa.Column(JSONB))
    after: dict[str, Any] | None = Field(default=None, sa_column=sa.Column(JSONB))
    created_at: datetime | None = timestamp_field(default_now=True)
