"""What happened to a tenant's runs, in the order it was committed: the source of outbound
webhooks and of the live status stream."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB
from sqlmodel import Field, SQLModel

from metering.models.base import tenant_id_field, tenant_primary_key, timestamp_field


class NotificationRow(SQLModel, table=True):
    """One thing a tenant may be told about (``metering.notifications.catalogue``).

    Written in the same transaction as the change it reports, so it exists exactly when the
    change does; append-only. ``id`` is the order: per run (and per customer) a later change
    has a higher id, which is what keeps webhooks in order and lets a stream resume from a
    ``Last-Event-ID``.
    """

    __tablename__ = "notifications"
    __table_args__ = (
        tenant_primary_key("id"),
        sa.ForeignKeyConstraint(
            ["tenant_id", "customer_id"], ["customers.tenant_id", "customers.id"]
        ),
        sa.ForeignKeyConstraint(["tenant_id", "run_id"], ["runs.tenant_id", "runs.id"]),
        # A customer's stream replays from here; a run's from the next.
        sa.Index("ix_notifications_tenant_id_customer_id_id", "tenant_id", "customer_id", "id"),
        sa.Index("ix_notifications_run_id_id", "run_id", "id"),
    )

    id: int | None = tenant_id_field()
    tenant_id: str = Field(max_length=64, primary_key=True)
    customer_id: str = Field(max_length=128)
    run_id: int | None = Field(default=None, sa_type=sa.BigInteger)
    subject: str | None = Field(default=None, max_length=200)
    type: str = Field(max_length=64)
    data: dict[str, Any] = Field(sa_column=sa.Column(JSONB, nullable=False))
    created_at: datetime | None = timestamp_field(default_now=True)
