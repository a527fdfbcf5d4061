"""Decisions: numbered, immutable versions per run; the newest is in force (docs/policy.md)."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY
from sqlmodel import Field, SQLModel

from metering.models.base import month_key_field, tenant_id_field


class DecisionRow(SQLModel, table=True):
    __tablename__ = "decisions"
    __table_args__ = (
        # Partitioned by month of decided_at (migration 0024).
        sa.PrimaryKeyConstraint("id", "tenant_id", "decided_at"),
        # A run's versions are numbered once: in one transaction by this key, across
        # transactions by the run's row lock and version counter, under which decisions are
        # written (the month in the key is one value per transaction). The tenant before
        # the month, so the key serves by-run reads.
        sa.Index(
            "uq_decisions_run_id_version_tenant_id_decided_at",
            "run_id",
            "version",
            "tenant_id",
            "decided_at",
            unique=True,
        ),
        sa.ForeignKeyConstraint(["tenant_id", "run_id"], ["runs.tenant_id", "runs.id"]),
        sa.CheckConstraint(
            "outcome IN ('confirmed', 'partially_credited', 'refunded', 'held_for_review')",
            name="outcome_known",
        ),
        sa.CheckConstraint(
            "billed_micros >= 0 AND credited_micros >= 0 "
            "AND billed_micros + credited_micros = gross_micros",
            name="billed_plus_credited_is_gross",
        ),
        sa.CheckConstraint("version >= 1", name="version_positive"),
        # Statements read decisions by customer and statement period.
        sa.Index(
            "ix_decisions_statement",
            "tenant_id",
            "customer_id",
            "statement_period",
            "run_id",
            "version",
        ),
    )

    id: int | None = tenant_id_field()
    run_id: int = Field(sa_type=sa.BigInteger)
    version: int = Field(sa_column=sa.Column(sa.Integer, nullable=False))
    tenant_id: str = Field(max_length=64, primary_key=True)
    customer_id: str = Field(max_length=128)
    origin: str = Field(max_length=16)  # "policy" | "support"
    outcome: str = Field(max_length=32)
    status: str = Field(max_length=64)
    gross_micros: int = Field(sa_column=sa.Column(sa.BigInteger, nullable=False))
    billed_micros: int = Field(sa_column=sa.Column(sa.BigInteger, nullable=False))
    credited_micros: int = Field(sa_column=sa.Column(sa.BigInteger, nullable=False))
    credited_line_ids: list[int] = Field(sa_column=sa.Column(ARRAY(sa.BigInteger), nullable=False))
    rule_ids: list[str] = Field(sa_column=sa.Column(ARRAY(sa.Text), nullable=False))
    evidence_event_ids: list[str] = Field(sa_column=sa.Column(ARRAY(sa.Text), nullable=False))
    explanation: str = Field(sa_column=sa.Column(sa.Text, nullable=False))
    evidence_version: int = Field(sa_column=sa.Column(sa.Integer, nullable=False))
    period: str = Field(max_length=7)
    # The statement this version appears on: the run's period while that is still open,
    # else the period in which the decision was made (a late correction). Fixed at insert,
    # so a closed statement never changes.
    statement_period: str = Field(max_length=7)
    started_at: datetime = Field(sa_column=sa.Column(sa.DateTime(timezone=True), nullable=False))
    models: list[str] = Field(sa_column=sa.Column(ARRAY(sa.Text), nullable=False))
    input_tokens: int = Field(sa_column=sa.Column(sa.BigInteger, nullable=False))
    cached_input_tokens: int = Field(sa_column=sa.Column(sa.BigInteger, nullable=False))
    output_tokens: int = Field(sa_column=sa.Column(sa.BigInteger, nullable=False))
    ended_at: datetime = Field(sa_column=sa.Column(sa.DateTime(timezone=True), nullable=False))
    decided_at: datetime | None = month_key_field(default_now=True)
    # The tenant's policy version that made this decision (0: the settings' default policy,
    # and every decision made before policies were versioned).
    policy_version: int = Field(
        default=0, sa_column=sa.Column(sa.Integer, nullable=False, server_default="0")
    )
    # The R8 inputs the policy was given (``CustomerPeriod``), so a replay can give the same;
    # NULL for decisions made before they were kept.
    period_gross_micros: int | None = Field(default=None, sa_column=sa.Column(sa.BigInteger))
    period_auto_credited_micros: int | None = Field(
        default=None, sa_column=sa.Column(sa.BigInteger)
    )
    period_auto_refunded_runs: int | None = Field(default=None, sa_column=sa.Column(sa.BigInteger))
    # The facts the policy was given, as one MessagePack record
    # (``metering/settlement/decided_facts.py``): a what-if replays from it. NULL for
    # decisions made before it was kept, which are replayed from the events instead.
    facts: bytes | None = Field(default=None, sa_column=sa.Column(sa.LargeBinary))
