"""stripe_carries: one carry per customer and period for meter events and credit notes
together (issue #29)

Carried apart, a meter remainder and a credit remainder were never netted: a customer billed
3.4 units and credited 0.5 paid 3 units, not ⌊2.9⌋ = 2 (metering/billing/rounding.py). The
new carry is the old meter carry minus the old credit carry (both were < one unit, so it
lies within one unit of zero; the next step rounds it back into [0, unit)).

A plan persisted before this migration and not yet fully sent gives back the carry of its
unsent cancels into the wrong month when dropped (those steps carried no date then): at most
one unit per such row, and only for rows in flight while the migration runs.

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-03 10:00:00

"""

from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = "0028"
down_revision: Union[str, Sequence[str], None] = "0027"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    op.add_column(
        "stripe_carries",
        sa.Column("carry_micros", sa.BigInteger(), nullable=False, server_default="0"),
    )
    op.execute("UPDATE stripe_carries SET carry_micros = meter_carry_micros - credit_carry_micros")
    op.drop_column("stripe_carries", "meter_carry_micros")
    op.drop_column("stripe_carries", "credit_carry_micros")


def downgrade() -> None:
    """Downgrade schema."""
    for name in ("meter_carry_micros", "credit_carry_micros"):
        op.add_column(
            "stripe_carries",
            sa.Column(name, sa.BigInteger(), nullable=False, server_default="0"),
        )
    op.execute("UPDATE stripe_carries SET meter_carry_micros = carry_micros")
    op.drop_column("stripe_carries", "carry_micros")
