"""Tenants' protection policy versions (issue #17)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB
from sqlmodel import Field, SQLModel

from metering.models.base import tenant_id_field, tenant_primary_key, timestamp_field


class PolicyVersionRow(SQLModel, table=True):
    """One version of a tenant's policy document, in force from ``effective_from``.

    Append-only (a trigger refuses UPDATE, DELETE and TRUNCATE): a decision names the version
    that made it, so a version must read the same for as long as the decision exists. No
    foreign key to ``tenants``, so that no ``TRUNCATE … CASCADE`` of tenants reaches it.
    Version 0 is not stored: it is the settings' default policy.
    """

    __tablename__ = "policy_versions"
    __table_args__ = (
        tenant_primary_key("id"),
        sa.UniqueConstraint("tenant_id", "version"),
        sa.CheckConstraint("version >= 1", name="version_positive"),
        sa.Index("ix_policy_versions_tenant_id_effective_from", "tenant_id", "effective_from"),
    )

    id: int | None = tenant_id_field()
    tenant_id: str = Field(max_length=64, primary_key=True)
    version: int = Field(sa_column=sa.Column(sa.Integer, nullable=False))
    document: dict[str, Any] = Field(sa_column=sa.Column(JSONB, nullable=False))
    effective_from: datetime = Field(
        sa_column=sa.Column(sa.DateTime(timezone=True), nullable=False)
    )
    created_at: datetime | None = timestamp_field(default_now=True)
    created_by: str = Field(max_length=128)
    # Why the version was made, in the operator's words (shown beside it in lists and diffs).
    note: str = Field(sa_column=sa.Column(sa.Text, nullable=False, server_default=""))


class PolicyWithdrawalRow(SQLModel, table=True):
    """A scheduled version withdrawn before it took effect: it is never in force.

    The version itself is never edited (append-only); its withdrawal is this row, one per
    version, written only while ``withdrawn_at`` is before the version's ``effective_from``,
    and append-only too, so a withdrawn version stays withdrawn. No foreign key to
    ``policy_versions`` (the use case finds the version under the tenant's policy lock): with
    one, ``TRUNCATE policy_versions`` would fail on the key before its append-only trigger.
    """

    __tablename__ = "policy_withdrawals"
    __table_args__ = (
        tenant_primary_key("id"),
        sa.UniqueConstraint("tenant_id", "version"),
    )

    id: int | None = tenant_id_field()
    tenant_id: str = Field(max_length=64, primary_key=True)
    version: int = Field(sa_column=sa.Column(sa.Integer, nullable=False))
    withdrawn_at: datetime | None = timestamp_field(default_now=True)
    # The key id of the admin who withdrew it ("cli" from the command line).
    withdrawn_by: str = Field(max_length=128)
    reason: str = Field(sa_column=sa.Column(sa.Text, nullable=False, server_default=""))
