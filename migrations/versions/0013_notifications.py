"""notifications: what happened to a tenant's runs, for webhooks and the status stream

Written in the same transaction as the change it reports (a status change at ingest, a
decision, a hold, a credit, a dispute), append-only, ordered by id.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01 21:20:00.000000

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa
import sqlmodel  # noqa: F401  (autogenerate renders sqlmodel.AutoString)
from sqlalchemy.dialects import postgresql


# revision identifiers, used by Alembic.
revision: str = '0013'
down_revision: Union[str, Sequence[str], None] = '0012'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table('notifications',
    sa.Column('id', sa.BigInteger(), nullable=False),
    sa.Column('tenant_id', sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
    sa.Column('customer_id', sqlmodel.sql.sqltypes.AutoString(length=128), nullable=False),
    sa.Column('run_id', sa.BigInteger(), nullable=True),
    sa.Column('subject', sqlmodel.sql.sqltypes.AutoString(length=200), nullable=True),
    sa.Column('type', sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
    sa.Column('data', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_notifications_run_id_runs')),
    sa.ForeignKeyConstraint(['tenant_id', 'customer_id'], ['customers.tenant_id', 'customers.id'], name=op.f('fk_notifications_tenant_id_customer_id_customers')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_notifications'))
    )
    op.create_index('ix_notifications_run_id_id', 'notifications', ['run_id', 'id'], unique=False)
    op.create_index('ix_notifications_tenant_id_customer_id_id', 'notifications', ['tenant_id', 'customer_id', 'id'], unique=False)


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_index('ix_notifications_tenant_id_customer_id_id', table_name='notifications')
    op.drop_index('ix_notifications_run_id_id', table_name='notifications')
    op.drop_table('notifications')
