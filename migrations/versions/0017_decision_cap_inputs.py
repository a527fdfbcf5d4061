"""decisions record the R8 cap inputs they were decided with

The protection cap (R8) reads the customer's period as it stood when the run was settled:
its gross so far and the automatic credits and refunds of other runs. Recording those three
figures on each decision lets a replay (the what-if of issue #17) give ``decide`` exactly
the inputs settlement gave it. NULL for decisions made before this revision: their inputs
were not kept.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-02 01:35:00

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = '0017'
down_revision: Union[str, Sequence[str], None] = '0016'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

COLUMNS = ('period_gross_micros', 'period_auto_credited_micros', 'period_auto_refunded_runs')


def upgrade() -> None:
    """Upgrade schema."""
    for name in COLUMNS:
        op.add_column('decisions', sa.Column(name, sa.BigInteger(), nullable=True))


def downgrade() -> None:
    """Downgrade schema."""
    for name in reversed(COLUMNS):
        op.drop_column('decisions', name)
