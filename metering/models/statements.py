"""The statement read model: one row per (run, statement period), kept by settlement.

Decisions are history; this table is a projection of them for fast statements (a page is an
index range scan; totals and chart read ``statement_totals``, kept beside it). ``*_abs``
hold the run's position after the latest decision on this statement; ``base_*`` the
position the previous statement left (zero for a run's own period), so the line shows
``abs - base``.
"""

from __future__ import annotations

from datetime import date, datetime

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY
from sqlmodel import Field, SQLModel

from metering.models.base import tenant_primary_key


def _bigint() -> sa.Column[int]:
    return sa.Column(sa.BigInteger, nullable=False)


class StatementLineRow(SQLModel, table=True):
    __tablename__ = "statement_lines"
    __table_args__ = (
        tenant_primary_key("run_id", "statement_period"),
        sa.ForeignKeyConstraint(["tenant_id", "run_id"], ["runs.tenant_id", "runs.id"]),
        sa.CheckConstraint("kind IN ('run', 'correction')", name="kind_known"),
        sa.Index(
            "ix_statement_lines_page",
            "tenant_id",
            "customer_id",
            "statement_period",
            "ended_at",
            "run_id",
        ),
    )

    run_id: int = Field(primary_key=True, sa_type=sa.BigInteger)
    statement_period: str = Field(primary_key=True, max_length=7)
    tenant_id: str = Field(max_length=64, primary_key=True)
    customer_id: str = Field(max_length=128)
    subject: str = Field(max_length=200)
    kind: str = Field(max_length=16)
    run_period: str = Field(max_length=7)
    version: int = Field(sa_column=sa.Column(sa.Integer, nullable=False))
    started_at: datetime = Field(sa_column=sa.Column(sa.DateTime(timezone=True), nullable=False))
    ended_at: datetime = Field(sa_column=sa.Column(sa.DateTime(timezone=True), nullable=False))
    decided_at: datetime = Field(sa_column=sa.Column(sa.DateTime(timezone=True), nullable=False))
    models: list[str] = Field(sa_column=sa.Column(ARRAY(sa.Text), nullable=False))
    input_tokens: int = Field(sa_column=_bigint())
    cached_input_tokens: int = Field(sa_column=_bigint())
    output_tokens: int = Field(sa_column=_bigint())
    gross_abs: int = Field(sa_column=_bigint())
    billed_abs: int = Field(sa_column=_bigint())
    credited_abs: int = Field(sa_column=_bigint())
    base_gross: int = Field(sa_column=_bigint())
    base_billed: int = Field(sa_column=_bigint())
    base_credited: int = Field(sa_column=_bigint())
    outcome: str = Field(max_length=32)
    status: str = Field(max_length=64)
    explanation: str = Field(sa_column=sa.Column(sa.Text, nullable=False))


class StatementTotalRow(SQLModel, table=True):
    """A statement's sums, by the only things a statement filters or charts on: the line's
    kind and outcome, the day its run ended (the page's date filter) and the day it is
    charted on (a run's end; a correction's decision).

    Kept by settlement in the transaction that writes the lines, as new line minus old, so
    a statement's totals and chart read a few dozen rows however many runs the customer has
    in the month; summed over lines they took 121 ms at 100,000 (docs/benchmarks.md,
    "Growth"). ``lines`` counts the lines the sums are over.
    """

    __tablename__ = "statement_totals"
    __table_args__ = (
        sa.PrimaryKeyConstraint(
            "tenant_id",
            "customer_id",
            "statement_period",
            "kind",
            "outcome",
            "ended_on",
            "charted_on",
        ),
    )

    tenant_id: str = Field(max_length=64)
    customer_id: str = Field(max_length=128)
    statement_period: str = Field(max_length=7)
    kind: str = Field(max_length=16)
    outcome: str = Field(max_length=32)
    ended_on: date = Field(sa_column=sa.Column(sa.Date, nullable=False))
    charted_on: date = Field(sa_column=sa.Column(sa.Date, nullable=False))
    gross_micros: int = Field(sa_column=_bigint())
    billed_micros: int = Field(sa_column=_bigint())
    credited_micros: int = Field(sa_column=_bigint())
    lines: int = Field(sa_column=_bigint())


class StatementClosingRow(SQLModel, table=True):
    """A customer's statement of a period, closed and announced (``statement.closed``).

    The primary key makes the announcement happen once: two beats closing the same
    statement at once insert one row, and only the one that inserted it records the
    notification. The totals are the statement's as it closed.
    """

    __tablename__ = "statement_closings"
    __table_args__ = (
        sa.ForeignKeyConstraint(
            ["tenant_id", "customer_id"], ["customers.tenant_id", "customers.id"]
        ),
    )

    tenant_id: str = Field(primary_key=True, max_length=64)
    customer_id: str = Field(primary_key=True, max_length=128)
    period: str = Field(primary_key=True, max_length=7)
    gross_micros: int = Field(sa_column=_bigint())
    billed_micros: int = Field(sa_column=_bigint())
    credited_micros: int = Field(sa_column=_bigint())
    held_micros: int = Field(sa_column=_bigint())
    runs: int = Field(sa_column=sa.Column(sa.Integer, nullable=False))
    closed_at: datetime = Field(sa_column=sa.Column(sa.DateTime(timezone=True), nullable=False))
