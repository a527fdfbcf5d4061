"""webhook claims per endpoint: the indexes a claim that limits each endpoint reads (issue #16)

A claim goes endpoint by endpoint, taking each one's due messages in order up to what it may
still hold, so one endpoint's backlog or hanging receiver cannot take every send slot.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-02 02:00:00

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = '0018'
down_revision: Union[str, Sequence[str], None] = '0017'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_index('ix_webhook_messages_endpoint_due', 'webhook_messages', ['endpoint_id', 'next_attempt_at', 'id'], unique=False, postgresql_where=sa.text("status = 'pending'"))
    op.create_index('ix_webhook_messages_leased', 'webhook_messages', ['endpoint_id'], unique=False, postgresql_where=sa.text("status = 'pending' AND claimed_until IS NOT NULL"))


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_index('ix_webhook_messages_leased', table_name='webhook_messages', postgresql_where=sa.text("status = 'pending' AND claimed_until IS NOT NULL"))
    op.drop_index('ix_webhook_messages_endpoint_due', table_name='webhook_messages', postgresql_where=sa.text("status = 'pending'"))
