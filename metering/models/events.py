"""Runs, the raw events that describe them, and the priced usage lines."""

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

# A run with evidence that no decision has seen yet (and not parked): the sweeper's work.
PENDING = "settled_evidence_version < evidence_version AND parked_at IS NULL"


class RunRow(SQLModel, table=True):
    """One agent run: ``(tenant, subject)``. Attempts and resumes belong to the same run.

    The time columns are maintained at ingest (as max/min over the run's events, so the
    order events arrive in does not matter) and let the sweeper find due runs by index.
    """

    __tablename__ = "runs"
    __table_args__ = (
        # The target of the composite foreign keys of the run's children, which make the
        # database refuse a row whose tenant is not its run's; and a run's id alone finds it.
        tenant_primary_key("id"),
        sa.UniqueConstraint("tenant_id", "subject"),
        # And with the customer, for ledger entries and support credits.
        sa.UniqueConstraint("tenant_id", "customer_id", "id"),
        sa.ForeignKeyConstraint(
            ["tenant_id", "customer_id"], ["customers.tenant_id", "customers.id"]
        ),
        sa.CheckConstraint("gross_micros >= 0", name="gross_not_negative"),
        sa.CheckConstraint(
            "billed_micros >= 0 AND credited_micros >= 0", name="position_not_negative"
        ),
        sa.CheckConstraint(
            "usage_protocol IN ('cloudevents', 'otlp')", name="usage_protocol_known"
        ),
        # The sweeper's work list: runs with evidence no decision has seen yet, by each
        # clock that can make one due (``metering.settlement.due``) and by claim, so a
        # sweep reads the due and the claimed runs, not every run in flight.
        sa.Index("ix_runs_pending", "last_event_at", postgresql_where=sa.text(PENDING)),
        sa.Index(
            "ix_runs_pending_terminal_at",
            "terminal_at",
            postgresql_where=sa.text(f"{PENDING} AND terminal_at IS NOT NULL"),
        ),
        sa.Index(
            "ix_runs_pending_last_lost_at",
            "last_lost_at",
            postgresql_where=sa.text(f"{PENDING} AND last_lost_at IS NOT NULL"),
        ),
        sa.Index(
            "ix_runs_pending_claimed_until",
            "claimed_until",
            postgresql_where=sa.text(f"{PENDING} AND claimed_until IS NOT NULL"),
        ),
        sa.Index("ix_runs_tenant_id_customer_id_period", "tenant_id", "customer_id", "period"),
    )

    id: int | None = tenant_id_field()
    tenant_id: str = Field(foreign_key="tenants.id", max_length=64, primary_key=True)
    subject: str = Field(max_length=200)
    customer_id: str = Field(max_length=128)
    first_event_at: datetime = Field(
        sa_column=sa.Column(sa.DateTime(timezone=True), nullable=False)
    )
    last_event_at: datetime = Field(sa_column=sa.Column(sa.DateTime(timezone=True), nullable=False))
    last_received_at: datetime = Field(
        sa_column=sa.Column(sa.DateTime(timezone=True), nullable=False)
    )
    # The least received_at of the run's events and usage lines, kept by ingest: the first
    # month their partitions can hold (NULL, for a run written outside ingest: unknown).
    first_received_at: datetime | None = timestamp_field(nullable=True)
    terminal_at: datetime | None = timestamp_field(nullable=True)
    # Latest connection.lost, and latest sign of life after one (restore, resume, usage):
    # a drop is "open" while last_lost_at > last_recovered_at.
    last_lost_at: datetime | None = timestamp_field(nullable=True)
    last_recovered_at: datetime | None = timestamp_field(nullable=True)
    event_count: int = Field(default=0, sa_column=sa.Column(sa.Integer, nullable=False))
    gross_micros: int = Field(
        default=0, sa_column=sa.Column(sa.BigInteger, nullable=False, server_default="0")
    )
    # Every accepted event bumps evidence_version; a decision records the version it saw.
    evidence_version: int = Field(
        default=0, sa_column=sa.Column(sa.Integer, nullable=False, server_default="0")
    )
    settled_evidence_version: int = Field(
        default=0, sa_column=sa.Column(sa.Integer, nullable=False, server_default="0")
    )
    # The decision in force, denormalised for the read side and for the cap (R8).
    decision_version: int = Field(
        default=0, sa_column=sa.Column(sa.Integer, nullable=False, server_default="0")
    )
    outcome: str | None = Field(default=None, max_length=32)
    status: str | None = Field(default=None, max_length=64)
    # The status words last announced (``run.status_changed``), which the run shows now:
    # ingest compares against them instead of recomputing a run's words for every event.
    # NULL: none announced yet (a run stored before announcements existed).
    announced_status: str | None = Field(default=None, max_length=64)
    # The ingest protocol that brought the run's first usage (``metering.ingest.protocol``):
    # usage through the other one is refused, since the same model call sent both ways has
    # two event ids and would be charged twice. NULL until the first usage.
    usage_protocol: str | None = Field(default=None, max_length=16)
    period: str | None = Field(default=None, max_length=7)
    ended_at: datetime | None = timestamp_field(nullable=True)
    # The run's ledger position: what has been posted as billed and released as credited.
    billed_micros: int = Field(
        default=0, sa_column=sa.Column(sa.BigInteger, nullable=False, server_default="0")
    )
    credited_micros: int = Field(
        default=0, sa_column=sa.Column(sa.BigInteger, nullable=False, server_default="0")
    )
    auto_credited_micros: int = Field(
        default=0, sa_column=sa.Column(sa.BigInteger, nullable=False, server_default="0")
    )
    # Sweeper bookkeeping: a claim lease, an attempt counter, and parking for poison runs.
    claimed_until: datetime | None = timestamp_field(nullable=True)
    settle_attempts: int = Field(
        default=0, sa_column=sa.Column(sa.Integer, nullable=False, server_default="0")
    )
    parked_at: datetime | None = timestamp_field(nullable=True)
    parked_reason: str | None = Field(default=None, max_length=500)
    # Support's say on the run, applied on top of every policy decision (so late evidence
    # never undoes a granted credit): extra credit granted, and whether a hold was released.
    support_credit_micros: int = Field(
        default=0, sa_column=sa.Column(sa.BigInteger, nullable=False, server_default="0")
    )
    support_released: bool = Field(
        default=False, sa_column=sa.Column(sa.Boolean, nullable=False, server_default="false")
    )


class EventRow(SQLModel, table=True):
    """A raw CloudEvent exactly as accepted, in canonical form, with its content hash.

    Partitioned by month of ``received_at`` (migration 0024), so a month can be archived
    and dropped whole. Its idempotency key ``(tenant_id, source, event_id)`` lives in
    :class:`EventKeyRow`, which outlives the month.
    """

    __tablename__ = "events"
    __table_args__ = (
        sa.PrimaryKeyConstraint("id", "tenant_id", "received_at"),
        sa.Index("ix_events_run_id_time", "run_id", "time"),
        # One key for both columns: the event's run, in the event's tenant (the run's own
        # key to ``tenants`` covers the tenant). One check per row instead of two, on the
        # ingest hot path (docs/benchmarks.md).
        sa.ForeignKeyConstraint(["tenant_id", "run_id"], ["runs.tenant_id", "runs.id"]),
    )

    id: int | None = tenant_id_field()
    tenant_id: str = Field(max_length=64, primary_key=True)
    source: str = Field(max_length=255)
    event_id: str = Field(max_length=255)
    type: str = Field(max_length=64)
    run_id: int = Field(sa_type=sa.BigInteger)
    time: datetime = Field(sa_column=sa.Column(sa.DateTime(timezone=True), nullable=False))
    # The server's clock, never the producer's: it picks the row's monthly partition.
    received_at: datetime = month_key_field()
    body_hash: bytes = Field(sa_column=sa.Column(sa.LargeBinary, nullable=False))
    attributes: dict[str, Any] = Field(sa_column=sa.Column(JSONB, nullable=False))
    data: dict[str, Any] = Field(sa_column=sa.Column(JSONB, nullable=False))


class EventKeyRow(SQLModel, table=True):
    """An event's idempotency key, kept forever (migration 0024).

    A partitioned table can only enforce a key that includes its partition key, and a
    month of raw events is archived and dropped after 13 months, while a producer may
    re-send an event any time later. So the key is a narrow table of its own, written in
    ingest's statement before the event: a re-sent event is a duplicate forever, and one
    re-sent with other content a 409 (``body_hash``), whether or not its month is still in
    the database. ``event_pk`` and ``received_at`` find the stored event.
    """

    __tablename__ = "event_keys"
    __table_args__ = (sa.PrimaryKeyConstraint("tenant_id", "source", "event_id"),)

    tenant_id: str = Field(max_length=64)
    source: str = Field(max_length=255)
    event_id: str = Field(max_length=255)
    body_hash: bytes = Field(sa_column=sa.Column(sa.LargeBinary, nullable=False))
    event_pk: int = Field(sa_type=sa.BigInteger)
    received_at: datetime = Field(sa_column=sa.Column(sa.DateTime(timezone=True), nullable=False))


class UsageLineRow(SQLModel, table=True):
    """One priced ``run.usage`` event. Immutable: prices are fixed at the event's time."""

    __tablename__ = "usage_lines"
    __table_args__ = (
        sa.CheckConstraint(
            "input_tokens >= 0 AND cached_input_tokens >= 0 AND output_tokens >= 0",
            name="tokens_not_negative",
        ),
        sa.CheckConstraint(
            "input_micros >= 0 AND cached_input_micros >= 0 AND output_micros >= 0",
            name="costs_not_negative",
        ),
        sa.CheckConstraint(
            "gross_micros = input_micros + cached_input_micros + output_micros",
            name="gross_is_sum_of_classes",
        ),
        sa.Index("ix_usage_lines_run_id", "run_id"),
        # Partitioned by month of its event's received_at (migration 0024).
        sa.PrimaryKeyConstraint("id", "tenant_id", "received_at"),
        # One line per event (an event's received_at is one value, so the month changes
        # nothing); the tenant comes before the month so the key serves by-event lookups.
        # No key into events: their month is archived long before the ledger's lines go.
        sa.Index(
            "uq_usage_lines_event_pk_tenant_id_received_at",
            "event_pk",
            "tenant_id",
            "received_at",
            unique=True,
        ),
        sa.ForeignKeyConstraint(["tenant_id", "run_id"], ["runs.tenant_id", "runs.id"]),
    )

    id: int | None = tenant_id_field()
    # The run's tenant, copied so the line's keys can include it (issue #18).
    tenant_id: str = Field(max_length=64, primary_key=True)
    event_pk: int = Field(sa_type=sa.BigInteger)
    run_id: int = Field(sa_type=sa.BigInteger)
    model: str = Field(max_length=128)
    step: int = Field(sa_column=sa.Column(sa.Integer, nullable=False))
    attempt: int = Field(sa_column=sa.Column(sa.Integer, nullable=False))
    tool_call_id: str | None = Field(default=None, max_length=255)
    replay: bool = Field(default=False)
    input_tokens: int = Field(sa_column=sa.Column(sa.BigInteger, nullable=False))
    cached_input_tokens: int = Field(sa_column=sa.Column(sa.BigInteger, nullable=False))
    output_tokens: int = Field(sa_column=sa.Column(sa.BigInteger, nullable=False))
    input_micros: int = Field(sa_column=sa.Column(sa.BigInteger, nullable=False))
    cached_input_micros: int = Field(sa_column=sa.Column(sa.BigInteger, nullable=False))
    output_micros: int = Field(sa_column=sa.Column(sa.BigInteger, nullable=False))
    gross_micros: int = Field(sa_column=sa.Column(sa.BigInteger, nullable=False))
    time: datetime = Field(sa_column=sa.Column(sa.DateTime(timezone=True), nullable=False))
    # Its event's: the server's clock when the event was stored, the line's partition key.
    received_at: datetime = month_key_field()
