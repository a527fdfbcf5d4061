"""archived_months: the months of monthly tables archived to Parquet and dropped (issue #18)

One row per table and month, written in the transaction that detaches and drops the
month's partition (``metering/history/archive.py``): where the file is, its rows and digest,
when the month left, and whether it is back for an audit (``restored_at``). The archive's
own bookkeeping, over every tenant's rows: not per tenant.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-02 12:30:00

"""

from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = "0025"
down_revision: Union[str, Sequence[str], None] = "0024"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table(
        "archived_months",
        sa.Column("table_name", sa.String(length=63), nullable=False),
        sa.Column("month", sa.Date(), nullable=False),
        sa.Column("partition_name", sa.String(length=63), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("rows", sa.BigInteger(), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("archived_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("restored_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("table_name", "month", name=op.f("pk_archived_months")),
    )


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_table("archived_months")
