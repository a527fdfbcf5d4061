"""Bookkeeping of the archive (issue #18, ``metering/history/archive.py``)."""

from __future__ import annotations

from datetime import date, datetime

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from metering.models.base import timestamp_field


class ArchivedMonthRow(SQLModel, table=True):
    """A month of a monthly table that was archived to a file and dropped: one row per table
    and month, written in the transaction that drops the partition. ``restored_at`` is set
    while the month is back in the database for an audit, and cleared when it leaves again.
    Not one tenant's data: a month's partition holds every tenant's rows."""

    __tablename__ = "archived_months"
    __table_args__ = (sa.PrimaryKeyConstraint("table_name", "month"),)

    table_name: str = Field(max_length=63)
    month: date = Field(sa_column=sa.Column(sa.Date, nullable=False))
    partition_name: str = Field(max_length=63)
    url: str = Field(sa_column=sa.Column(sa.Text, nullable=False))
    rows: int = Field(sa_column=sa.Column(sa.BigInteger, nullable=False))
    digest: str = Field(max_length=64)
    archived_at: datetime = timestamp_field()
    restored_at: datetime | None = timestamp_field(nullable=True)
