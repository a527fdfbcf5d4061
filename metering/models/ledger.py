"""The append-only ledger (docs/policy.md).

Ingest writes one ``hold`` per usage line. Settlement ``post``s the billed part and
``release``s the credited part; support and late evidence add signed ``correction`` entries
that name the side they correct (``billed`` or ``credited``). So, per run:
gross = Σ hold; billed = Σ post + Σ correction(billed); credited = Σ release +
Σ correction(credited); and once settled (and not held) gross = billed + credited.
A trigger in the migration refuses UPDATE and DELETE, so history cannot be rewritten.
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from metering.models.base import month_key_field, tenant_id_field

LEDGER_KINDS = ("hold", "post", "release", "correction")


class LedgerEntryRow(SQLModel, table=True):
    __tablename__ = "ledger_entries"
    __table_args__ = (
        sa.CheckConstraint("kind IN ('hold', 'post', 'release', 'correction')", name="kind_known"),
        sa.CheckConstraint(
            "kind = 'correction' OR amount_micros >= 0", name="only_corrections_are_signed"
        ),
        sa.CheckConstraint(
            "(kind = 'hold') = (usage_line_id IS NOT NULL)", name="holds_reference_usage"
        ),
        # One hold per usage line: a retried ingest can never hold twice.
        # Partitioned by month of created_at (migration 0024). A hold is written in the
        # statement that writes its usage line, so the month in its key changes nothing.
        sa.PrimaryKeyConstraint("id", "tenant_id", "created_at"),
        sa.Index(
            "uq_ledger_entries_hold_usage_line",
            "usage_line_id",
            "tenant_id",
            "created_at",
            unique=True,
            postgresql_where=sa.text("kind = 'hold'"),
        ),
        sa.CheckConstraint(
            "(kind = 'correction') = (corrects IS NOT NULL)", name="corrections_name_a_side"
        ),
        sa.CheckConstraint(
            "corrects IS NULL OR corrects IN ('billed', 'credited')", name="corrects_known"
        ),
        # A decision's postings are written once: a retried settlement cannot post twice
        # in its transaction (this key), nor in another (the run's row lock and version
        # counter, under which postings are written: the month is one value per decision).
        sa.Index(
            "uq_ledger_entries_decision_posting",
            "run_id",
            "decision_version",
            "kind",
            "corrects",
            "tenant_id",
            "created_at",
            unique=True,
            postgresql_where=sa.text("kind <> 'hold'"),
            postgresql_nulls_not_distinct=True,
        ),
        sa.Index("ix_ledger_entries_run_id", "run_id"),
        sa.Index("ix_ledger_entries_tenant_id_customer_id", "tenant_id", "customer_id"),
        # Money moves only on the run's own customer's books: an entry whose tenant or
        # customer is not its run's is refused by the database, not just by the code.
        sa.ForeignKeyConstraint(
            ["tenant_id", "customer_id", "run_id"],
            ["runs.tenant_id", "runs.customer_id", "runs.id"],
        ),
    )

    id: int | None = tenant_id_field()
    tenant_id: str = Field(max_length=64, primary_key=True)
    customer_id: str = Field(max_length=128)
    run_id: int = Field(sa_type=sa.BigInteger)
    kind: str = Field(max_length=16)
    amount_micros: int = Field(sa_column=sa.Column(sa.BigInteger, nullable=False))
    usage_line_id: int | None = Field(default=None, sa_type=sa.BigInteger)
    decision_version: int | None = Field(default=None)
    corrects: str | None = Field(default=None, max_length=16)  # "billed" | "credited"
    created_at: datetime | None = month_key_field(default_now=True)
