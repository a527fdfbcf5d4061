"""Outbound webhooks: a tenant's endpoints, one message per (endpoint, notification), each
attempt to deliver it, and how far the fan-out has read the notifications."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlmodel import Field, SQLModel

from metering.models.base import tenant_id_field, tenant_primary_key, timestamp_field

MESSAGE_STATUSES = ("pending", "delivered", "failed")


class WebhookEndpointRow(SQLModel, table=True):
    """Where a tenant wants to be told, and what about (``event_types``; empty: everything).

    The signing secret is not stored: ``secret_seed`` is, and the secret is an HMAC of it
    under the key pepper (``metering.webhooks.secrets``), so a copy of this table cannot sign.
    After a rotation the previous seed keeps signing until ``previous_seed_expires_at``.
    ``failing_since``: the first failed attempt since the last delivered one; an endpoint
    failing long enough is disabled with ``disabled_reason``.
    """

    __tablename__ = "webhook_endpoints"
    __table_args__ = (
        tenant_primary_key("id"),
        sa.Index("ix_webhook_endpoints_tenant_id_created_at", "tenant_id", "created_at"),
    )

    id: str = Field(primary_key=True, max_length=40)
    tenant_id: str = Field(foreign_key="tenants.id", max_length=64, primary_key=True)
    url: str = Field(sa_column=sa.Column(sa.Text, nullable=False))
    event_types: list[str] = Field(
        sa_column=sa.Column(ARRAY(sa.Text), nullable=False, server_default="{}")
    )
    description: str = Field(sa_column=sa.Column(sa.Text, nullable=False, server_default=""))
    enabled: bool = Field(sa_column=sa.Column(sa.Boolean, nullable=False))
    disabled_reason: str | None = Field(default=None, sa_column=sa.Column(sa.Text))
    disabled_at: datetime | None = timestamp_field(nullable=True)
    failing_since: datetime | None = timestamp_field(nullable=True)
    # The circuit breaker (metering/webhooks/breaker.py): failures in a row, and no send
    # before ``breaker_open_until``.
    breaker_failures: int = Field(
        default=0, sa_column=sa.Column(sa.Integer, nullable=False, server_default="0")
    )
    breaker_open_until: datetime | None = timestamp_field(nullable=True)
    secret_seed: str = Field(max_length=64)
    previous_secret_seed: str | None = Field(default=None, max_length=64)
    previous_seed_expires_at: datetime | None = timestamp_field(nullable=True)
    created_at: datetime | None = timestamp_field(default_now=True)
    updated_at: datetime | None = timestamp_field(default_now=True)


class WebhookMessageRow(SQLModel, table=True):
    """One notification for one endpoint, with its body frozen when it was made, so every
    attempt sends the same bytes under the same ``msg_id`` (the ``webhook-id`` header).

    ``attempts`` numbers every attempt ever started (a claim takes the next number);
    ``tries`` counts those of the current round of retries, which a redelivery restarts.
    Messages of one run for one endpoint go out in the order of their notifications: only
    the earliest pending one is claimed.
    """

    __tablename__ = "webhook_messages"
    __table_args__ = (
        tenant_primary_key("id"),
        sa.UniqueConstraint("endpoint_id", "notification_id", "tenant_id"),
        sa.UniqueConstraint("msg_id", "tenant_id"),
        sa.ForeignKeyConstraint(
            ["tenant_id", "notification_id"], ["notifications.tenant_id", "notifications.id"]
        ),
        sa.CheckConstraint("status IN ('pending', 'delivered', 'failed')", name="status_known"),
        sa.ForeignKeyConstraint(
            ["tenant_id", "endpoint_id"],
            ["webhook_endpoints.tenant_id", "webhook_endpoints.id"],
            ondelete="CASCADE",
        ),
        # Due messages in the order claims take them.
        sa.Index(
            "ix_webhook_messages_due",
            "next_attempt_at",
            "id",
            postgresql_where=sa.text("status = 'pending'"),
        ),
        # The head of each (endpoint, run) line: is an earlier message still pending?
        sa.Index(
            "ix_webhook_messages_line",
            "endpoint_id",
            "run_id",
            "notification_id",
            postgresql_where=sa.text("status = 'pending'"),
        ),
        # Each endpoint's due messages in claim order (claims go endpoint by endpoint).
        sa.Index(
            "ix_webhook_messages_endpoint_due",
            "endpoint_id",
            "next_attempt_at",
            "id",
            postgresql_where=sa.text("status = 'pending'"),
        ),
        # The messages leased now, per endpoint (the claim's per-endpoint limit).
        sa.Index(
            "ix_webhook_messages_leased",
            "endpoint_id",
            postgresql_where=sa.text("status = 'pending' AND claimed_until IS NOT NULL"),
        ),
        # The delivery log, newest first.
        sa.Index("ix_webhook_messages_endpoint_id_id", "endpoint_id", "id"),
        sa.Index("ix_webhook_messages_notification_id", "notification_id"),
    )

    id: int | None = tenant_id_field()
    msg_id: str = Field(max_length=40)
    tenant_id: str = Field(max_length=64, primary_key=True)
    endpoint_id: str = Field(max_length=40)
    notification_id: int = Field(sa_type=sa.BigInteger)
    run_id: int | None = Field(default=None, sa_type=sa.BigInteger)
    subject: str | None = Field(default=None, max_length=200)
    type: str = Field(max_length=64)
    payload: str = Field(sa_column=sa.Column(sa.Text, nullable=False))
    status: str = Field(max_length=16)
    attempts: int = Field(
        default=0, sa_column=sa.Column(sa.Integer, nullable=False, server_default="0")
    )
    tries: int = Field(
        default=0, sa_column=sa.Column(sa.Integer, nullable=False, server_default="0")
    )
    next_attempt_at: datetime | None = timestamp_field(default_now=True)
    claimed_until: datetime | None = timestamp_field(nullable=True)
    created_at: datetime | None = timestamp_field(default_now=True)
    finished_at: datetime | None = timestamp_field(nullable=True)


class WebhookAttemptRow(SQLModel, table=True):
    """One attempt to deliver a message: what the receiver answered (or why nothing was
    sent: a refused address, a timeout), how long it took, and the start of its reply."""

    __tablename__ = "webhook_attempts"
    __table_args__ = (
        tenant_primary_key("id"),
        sa.UniqueConstraint("message_id", "attempt", "tenant_id"),
        sa.ForeignKeyConstraint(
            ["tenant_id", "message_id"],
            ["webhook_messages.tenant_id", "webhook_messages.id"],
            ondelete="CASCADE",
        ),
        sa.CheckConstraint("outcome IN ('delivered', 'failed')", name="outcome_known"),
    )

    id: int | None = tenant_id_field()
    # The message's tenant, copied so the attempt's keys can include it (issue #18).
    tenant_id: str = Field(max_length=64, primary_key=True)
    message_id: int = Field(sa_type=sa.BigInteger)
    attempt: int = Field(sa_column=sa.Column(sa.Integer, nullable=False))
    outcome: str = Field(max_length=16)
    started_at: datetime = Field(sa_column=sa.Column(sa.DateTime(timezone=True), nullable=False))
    status_code: int | None = Field(default=None)
    latency_ms: int = Field(sa_column=sa.Column(sa.Integer, nullable=False))
    response_excerpt: str | None = Field(default=None, max_length=500)
    error: str | None = Field(default=None, sa_column=sa.Column(sa.Text))


class WebhookFanoutRow(SQLModel, table=True):
    """How far the fan-out has read ``notifications``: every id up to ``fanned_out_to`` was
    looked at, except ``gaps``: ids passed over because their transaction had not committed
    yet, each with when it was first missed (looked for again until the horizon)."""

    __tablename__ = "webhook_fanout"

    name: str = Field(primary_key=True, max_length=32)
    fanned_out_to: int = Field(sa_column=sa.Column(sa.BigInteger, nullable=False))
    gaps: dict[str, Any] = Field(
        sa_column=sa.Column(JSONB, nullable=False, server_default=sa.text("'{}'::jsonb"))
    )
    updated_at: datetime | None = timestamp_field(default_now=True)
