"""The price catalog: micro-USD per million tokens, by model and token class, over time."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from metering.models.base import timestamp_field


class PriceRow(SQLModel, table=True):
    __tablename__ = "prices"
    __table_args__ = (
        sa.UniqueConstraint("model", "token_class", "effective_from"),
        sa.CheckConstraint(
            "token_class IN ('input', 'cached_input', 'output')", name="token_class_known"
        ),
        sa.CheckConstraint("micros_per_mtok >= 0", name="price_not_negative"),
    )

    id: int | None = Field(default=None, primary_key=True, sa_type=sa.BigInteger)
    model: str = Field(max_length=128)
    token_class: str = Field(max_length=16)
    micros_per_mtok: int = Field(sa_column=sa.Column(sa.BigInteger, nullable=False))
    effective_from: datetime = Field(
        sa_column=sa.Column(sa.DateTime(timezone=True), nullable=False)
    )
    created_at: datetime | None = timestamp_field(default_now=True)


class ProviderCostRow(SQLModel, table=True):
    """What the model provider charges the platform, in the price catalog's shape.

    A table of its own (not a flag on ``prices``) so no query that bills a customer can
    ever read a cost, and the two catalogs change independently.
    """

    __tablename__ = "provider_costs"
    __table_args__ = (
        sa.UniqueConstraint("model", "token_class", "effective_from"),
        sa.CheckConstraint(
            "token_class IN ('input', 'cached_input', 'output')", name="token_class_known"
        ),
        sa.CheckConstraint("micros_per_mtok >= 0", name="cost_not_negative"),
    )

    id: int | None = Field(default=None, primary_key=True, sa_type=sa.BigInteger)
    model: str = Field(max_length=128)
    token_class: str = Field(max_length=16)
    micros_per_mtok: int = Field(sa_column=sa.Column(sa.BigInteger, nullable=False))
    effective_from: datetime = Field(
        sa_column=sa.Column(sa.DateTime(timezone=True), nullable=False)
    )
    created_at: datetime | None = timestamp_field(default_now=True)
