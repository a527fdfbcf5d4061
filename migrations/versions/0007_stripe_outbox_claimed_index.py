"""stripe outbox: index the leased rows and the due order, so a claim does not scan the backlog

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 09:00:00.000000

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa

# revision identifiers, used by Alembic.
revision: str = '0007'
down_revision: Union[str, Sequence[str], None] = '0006'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    op.drop_index('ix_stripe_outbox_due', table_name='stripe_outbox', postgresql_where=sa.text("status = 'pending'"))
    op.create_index('ix_stripe_outbox_due', 'stripe_outbox', ['next_attempt_at', 'id'], unique=False, postgresql_where=sa.text("status = 'pending'"))
    op.create_index('ix_stripe_outbox_claimed', 'stripe_outbox', ['claimed_until'], unique=False, postgresql_where=sa.text("status = 'pending'"))


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_index('ix_stripe_outbox_claimed', table_name='stripe_outbox', postgresql_where=sa.text("status = 'pending'"))
    op.drop_index('ix_stripe_outbox_due', table_name='stripe_outbox', postgresql_where=sa.text("status = 'pending'"))
    op.create_index('ix_stripe_outbox_due', 'stripe_outbox', ['next_attempt_at'], unique=False, postgresql_where=sa.text("status = 'pending'"))
