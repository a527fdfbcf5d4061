"""Stripe sync state: the outbox, what Stripe has received, carries, and the webhook inbox."""

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

OUTBOX_STATUSES = ("pending", "waiting_customer", "sent", "dead", "superseded")


class StripeOutboxRow(SQLModel, table=True):
    """One decision version whose billed amount must reach Stripe (docs/stripe.md).

    Written in the settlement transaction. The pusher turns it into a persisted ``plan`` of
    Stripe calls (meter event, cancel, balance credit) and walks it step by step, so a crash
    between two calls resumes where it stopped, with the same identifiers and keys.
    """

    __tablename__ = "stripe_outbox"
    __table_args__ = (
        tenant_primary_key("id"),
        # One row per decision version; the tenant last, so the key serves by-run lookups.
        sa.UniqueConstraint("run_id", "decision_version", "tenant_id"),
        sa.ForeignKeyConstraint(["tenant_id", "run_id"], ["runs.tenant_id", "runs.id"]),
        sa.CheckConstraint(
            "status IN ('pending', 'waiting_customer', 'sent', 'dead', 'superseded')",
            name="status_known",
        ),
        sa.CheckConstraint("target_billed_micros >= 0", name="target_not_negative"),
        # Due rows in the order claims take them (id breaks the ties of one settlement
        # transaction's rows), so a claim reads only as far as its LIMIT.
        sa.Index(
            "ix_stripe_outbox_due",
            "next_attempt_at",
            "id",
            postgresql_where=sa.text("status = 'pending'"),
        ),
        sa.Index("ix_stripe_outbox_tenant_id_customer_id", "tenant_id", "customer_id"),
        # The rows a pusher holds right now (claims skip their customers): a range scan
        # over the leases, not over the whole backlog.
        sa.Index(
            "ix_stripe_outbox_claimed",
            "claimed_until",
            postgresql_where=sa.text("status = 'pending'"),
        ),
    )

    id: int | None = tenant_id_field()
    tenant_id: str = Field(max_length=64, primary_key=True)
    customer_id: str = Field(max_length=128)
    run_id: int = Field(sa_type=sa.BigInteger)
    decision_version: int = Field(sa_column=sa.Column(sa.Integer, nullable=False))
    target_billed_micros: int = Field(sa_column=sa.Column(sa.BigInteger, nullable=False))
    period: str = Field(max_length=7)
    event_timestamp: datetime = Field(
        sa_column=sa.Column(sa.DateTime(timezone=True), nullable=False)
    )
    status: str = Field(max_length=20)
    plan: list[dict[str, Any]] | None = Field(default=None, sa_column=sa.Column(JSONB))
    next_step: int = Field(
        default=0, sa_column=sa.Column(sa.Integer, nullable=False, server_default="0")
    )
    attempts: int = Field(
        default=0, sa_column=sa.Column(sa.Integer, nullable=False, server_default="0")
    )
    next_attempt_at: datetime | None = timestamp_field(default_now=True)
    claimed_until: datetime | None = timestamp_field(nullable=True)
    last_error: str | None = Field(default=None, sa_column=sa.Column(sa.Text))
    created_at: datetime | None = timestamp_field(default_now=True)
    completed_at: datetime | None = timestamp_field(nullable=True)
    # Bumped when the row is resent after reconciling with Stripe (a replayed 5xx, a key
    # older than Stripe's 24 h idempotency window, a rejection, a dead-letter retry): its
    # calls then go out under fresh idempotency keys and meter-event identifiers.
    generation: int = Field(
        default=0, sa_column=sa.Column(sa.Integer, nullable=False, server_default="0")
    )
    # When the current generation's first call was made: retries stay inside Stripe's
    # idempotency window, measured from here.
    first_attempt_at: datetime | None = timestamp_field(nullable=True)


class StripeCustomerLeaseRow(SQLModel, table=True):
    """A pusher's hold on one customer: from claiming the customer's rows until every
    result of its calls is recorded, whatever those rows' status meanwhile (a correction
    supersedes a row in flight). Claims skip customers whose lease is in force; its holder
    renews it while the round lasts and deletes it when done, so a killed pusher's lease
    lapses after ``stripe_push_lease_s`` (issue #29)."""

    __tablename__ = "stripe_customer_leases"
    __table_args__ = (
        sa.PrimaryKeyConstraint("tenant_id", "customer_id"),
        sa.ForeignKeyConstraint(
            ["tenant_id", "customer_id"], ["customers.tenant_id", "customers.id"]
        ),
    )

    tenant_id: str = Field(max_length=64)
    customer_id: str = Field(max_length=128)
    holder: str = Field(max_length=64)  # the round that holds it (renews and releases its own)
    held_until: datetime = Field(sa_column=sa.Column(sa.DateTime(timezone=True), nullable=False))


DELIVERY_KINDS = ("meter_event", "meter_cancel", "meter_rejected", "credit_note", "balance_credit")


class StripeDeliveryRow(SQLModel, table=True):
    """A Stripe call that took effect. Append-only; ``micros`` is its signed effect on what
    Stripe will bill (a cancel, a rejection Stripe reported later, a credit note or a legacy
    balance credit is negative). Credit notes keep the invoice, its currency and the amount
    Stripe credited in that currency's minor unit."""

    __tablename__ = "stripe_deliveries"
    __table_args__ = (
        # Partitioned by month of stripe_received_at (migration 0024); each delivery is
        # recorded once by StripeDeliveryKeyRow, whatever its month.
        sa.PrimaryKeyConstraint("id", "tenant_id", "stripe_received_at"),
        sa.Index(
            "uq_stripe_deliveries_kind_identifier_tenant_id_received",
            "kind",
            "identifier",
            "tenant_id",
            "stripe_received_at",
            unique=True,
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id", "outbox_id"], ["stripe_outbox.tenant_id", "stripe_outbox.id"]
        ),
        sa.ForeignKeyConstraint(["tenant_id", "run_id"], ["runs.tenant_id", "runs.id"]),
        sa.CheckConstraint(
            "kind IN ('meter_event', 'meter_cancel', 'meter_rejected', 'credit_note', "
            "'balance_credit')",
            name="kind_known",
        ),
        sa.Index("ix_stripe_deliveries_run_id", "run_id"),
        sa.Index("ix_stripe_deliveries_tenant_id_customer_id", "tenant_id", "customer_id"),
    )

    id: int | None = tenant_id_field()
    outbox_id: int = Field(sa_type=sa.BigInteger)
    tenant_id: str = Field(max_length=64, primary_key=True)
    customer_id: str = Field(max_length=128)
    run_id: int = Field(sa_type=sa.BigInteger)
    kind: str = Field(max_length=20)
    identifier: str = Field(max_length=120)
    cancels_identifier: str | None = Field(default=None, max_length=120)
    micros: int = Field(sa_column=sa.Column(sa.BigInteger, nullable=False))
    units: int = Field(default=0, sa_column=sa.Column(sa.BigInteger, nullable=False))
    cents: int = Field(default=0, sa_column=sa.Column(sa.BigInteger, nullable=False))
    event_timestamp: datetime | None = timestamp_field(nullable=True)
    stripe_received_at: datetime = month_key_field()
    note: str | None = Field(default=None, max_length=200)
    invoice_id: str | None = Field(default=None, max_length=255)
    currency: str | None = Field(default=None, max_length=3)
    amount_minor: int | None = Field(default=None, sa_column=sa.Column(sa.BigInteger))


class StripeDeliveryKeyRow(SQLModel, table=True):
    """Each Stripe delivery's key, kept forever (migration 0024): a delivery is recorded
    once though a retry or Stripe's webhook about it comes in another transaction, or
    another month, than the first record (the partitioned deliveries table can only hold a
    key that includes the month). Written in the statement that records the delivery."""

    __tablename__ = "stripe_delivery_keys"
    __table_args__ = (sa.PrimaryKeyConstraint("tenant_id", "kind", "identifier"),)

    tenant_id: str = Field(max_length=64)
    kind: str = Field(max_length=20)
    identifier: str = Field(max_length=120)


class StripeCarryRow(SQLModel, table=True):
    """The sub-unit remainder of a customer's period (the UTC month a step lands in), one
    for meter events and credit notes together (``metering/billing/rounding.py``)."""

    __tablename__ = "stripe_carries"

    tenant_id: str = Field(primary_key=True, max_length=64)
    customer_id: str = Field(primary_key=True, max_length=128)
    period: str = Field(primary_key=True, max_length=7)
    carry_micros: int = Field(
        default=0, sa_column=sa.Column(sa.BigInteger, nullable=False, server_default="0")
    )


class StripeWebhookRow(SQLModel, table=True):
    """The webhook inbox: verified events, stored before they are handled; repeats no-op."""

    __tablename__ = "stripe_webhook_inbox"

    event_id: str = Field(primary_key=True, max_length=255)
    type: str = Field(max_length=120)
    payload: dict[str, Any] = Field(sa_column=sa.Column(JSONB, nullable=False))
    received_at: datetime | None = timestamp_field(default_now=True)
    handled_at: datetime | None = timestamp_field(nullable=True)
    error: str | None = Field(default=None, sa_column=sa.Column(sa.Text))


class StripeClosedPeriodRow(SQLModel, table=True):
    """A finalized invoice: its period is closed to negative meter corrections."""

    __tablename__ = "stripe_closed_periods"

    invoice_id: str = Field(primary_key=True, max_length=255)
    stripe_customer_id: str = Field(max_length=255, index=True)
    period_start: datetime = Field(sa_column=sa.Column(sa.DateTime(timezone=True), nullable=False))
    period_end: datetime = Field(sa_column=sa.Column(sa.DateTime(timezone=True), nullable=False))
    closed_at: datetime | None = timestamp_field(default_now=True)


class StripeInvoiceRow(SQLModel, table=True):
    """What Stripe's invoice webhooks said about a customer's invoice: its period, currency,
    when it finalizes and whether it is finalized or paid. The planner reads it to know
    which periods are still open; credit notes are issued against these invoices."""

    __tablename__ = "stripe_invoices"

    invoice_id: str = Field(primary_key=True, max_length=255)
    stripe_customer_id: str = Field(max_length=255, index=True)
    currency: str = Field(max_length=3)
    status: str = Field(max_length=20)
    period_start: datetime = Field(sa_column=sa.Column(sa.DateTime(timezone=True), nullable=False))
    period_end: datetime = Field(sa_column=sa.Column(sa.DateTime(timezone=True), nullable=False))
    finalizes_at: datetime | None = timestamp_field(nullable=True)
    finalized_at: datetime | None = timestamp_field(nullable=True)
    paid_at: datetime | None = timestamp_field(nullable=True)
    updated_at: datetime | None = timestamp_field(default_now=True)
