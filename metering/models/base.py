"""Shared column helpers. Timestamps are always timezone-aware UTC."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

metadata = SQLModel.metadata
metadata.naming_convention = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_N_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(UTC)


def timestamp_field(*, nullable: bool = False, default_now: bool = False) -> Any:
    """A ``timestamptz`` column; ``default_now`` also sets the server default."""
    server_default = sa.func.now() if default_now else None
    return Field(
        default=None,
        sa_column=sa.Column(
            sa.DateTime(timezone=True), nullable=nullable, server_default=server_default
        ),
    )


def micros_field(*, nullable: bool = False) -> Any:
    """A BIGINT micro-USD amount."""
    return Field(default=None, sa_column=sa.Column(sa.BigInteger, nullable=nullable))


def month_key_field(*, default_now: bool = False) -> Any:
    """The server-set ``timestamptz`` that picks a row's monthly partition (docs/scaling.md,
    "Monthly partitions"); a partitioned table's primary key must include it."""
    return Field(
        default=None,
        sa_column=sa.Column(
            sa.DateTime(timezone=True),
            primary_key=True,
            nullable=False,
            server_default=sa.func.now() if default_now else None,
        ),
    )


def tenant_id_field() -> Any:
    """The row's id, first column of its primary key ``(id, tenant_id)`` (issue #18).

    Ids still come from the table's own sequence, so they stay unique in practice and the
    code still finds a row by its id alone, through the primary key; the database enforces
    uniqueness with the tenant, which is what a table distributed by tenant can enforce.
    """
    return Field(
        default=None,
        primary_key=True,
        sa_type=sa.BigInteger,
        sa_column_kwargs={"autoincrement": True},
    )


def tenant_primary_key(*columns: str) -> sa.PrimaryKeyConstraint:
    """``PRIMARY KEY (*columns, tenant_id)``: every tenant table's key includes its tenant,
    so a database distributed by tenant can enforce it on one shard (docs/scaling.md).

    The tenant comes last: the key still serves every lookup by id alone (tasks, claims,
    child rows), and it never competes with the ``(tenant_id, …)`` indexes that serve a
    tenant's queries. Led by the tenant, it did: on a table without statistics yet (a new
    database, later a new monthly partition) the planner took it for the event
    idempotency probe and scanned the tenant's every event, ingest ran 10 x slower.
    """
    return sa.PrimaryKeyConstraint(*columns, "tenant_id")
