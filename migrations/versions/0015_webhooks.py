"""webhooks: endpoints, messages, attempts and the fan-out cursor (issue #16)

A tenant's endpoints; one message per (endpoint, notification) with its body frozen, so every
retry sends the same bytes under the same webhook-id; each attempt to deliver it; and how far
the fan-out has read the notifications. The cursor starts at the notifications already
written: endpoints made from now on are told only what happens from now on.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-01 21:00:50.407790

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa
import sqlmodel  # noqa: F401  (autogenerate renders sqlmodel.AutoString)
from sqlalchemy.dialects import postgresql


# revision identifiers, used by Alembic.
revision: str = '0015'
down_revision: Union[str, Sequence[str], None] = '0014'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table('webhook_fanout',
    sa.Column('name', sqlmodel.sql.sqltypes.AutoString(length=32), nullable=False),
    sa.Column('fanned_out_to', sa.BigInteger(), nullable=False),
    sa.Column('gaps', postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'{}'::jsonb"), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_webhook_fanout'))
    )
    op.create_table('webhook_endpoints',
    sa.Column('id', sqlmodel.sql.sqltypes.AutoString(length=40), nullable=False),
    sa.Column('tenant_id', sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
    sa.Column('url', sa.Text(), nullable=False),
    sa.Column('event_types', postgresql.ARRAY(sa.Text()), server_default='{}', nullable=False),
    sa.Column('description', sa.Text(), server_default='', nullable=False),
    sa.Column('enabled', sa.Boolean(), nullable=False),
    sa.Column('disabled_reason', sa.Text(), nullable=True),
    sa.Column('disabled_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('failing_since', sa.DateTime(timezone=True), nullable=True),
    sa.Column('secret_seed', sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
    sa.Column('previous_secret_seed', sqlmodel.sql.sqltypes.AutoString(length=64), nullable=True),
    sa.Column('previous_seed_expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_webhook_endpoints_tenant_id_tenants')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_webhook_endpoints')),
    sa.UniqueConstraint('tenant_id', 'id', name=op.f('uq_webhook_endpoints_tenant_id_id'))
    )
    op.create_index('ix_webhook_endpoints_tenant_id_created_at', 'webhook_endpoints', ['tenant_id', 'created_at'], unique=False)
    op.create_table('webhook_messages',
    sa.Column('id', sa.BigInteger(), nullable=False),
    sa.Column('msg_id', sqlmodel.sql.sqltypes.AutoString(length=40), nullable=False),
    sa.Column('tenant_id', sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
    sa.Column('endpoint_id', sqlmodel.sql.sqltypes.AutoString(length=40), nullable=False),
    sa.Column('notification_id', sa.BigInteger(), nullable=False),
    sa.Column('run_id', sa.BigInteger(), nullable=True),
    sa.Column('subject', sqlmodel.sql.sqltypes.AutoString(length=200), nullable=True),
    sa.Column('type', sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
    sa.Column('payload', sa.Text(), nullable=False),
    sa.Column('status', sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
    sa.Column('attempts', sa.Integer(), server_default='0', nullable=False),
    sa.Column('tries', sa.Integer(), server_default='0', nullable=False),
    sa.Column('next_attempt_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('claimed_until', sa.DateTime(timezone=True), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("status IN ('pending', 'delivered', 'failed')", name=op.f('ck_webhook_messages_status_known')),
    sa.ForeignKeyConstraint(['notification_id'], ['notifications.id'], name=op.f('fk_webhook_messages_notification_id_notifications')),
    sa.ForeignKeyConstraint(['tenant_id', 'endpoint_id'], ['webhook_endpoints.tenant_id', 'webhook_endpoints.id'], name=op.f('fk_webhook_messages_tenant_id_endpoint_id_webhook_endpoints'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_webhook_messages')),
    sa.UniqueConstraint('endpoint_id', 'notification_id', name=op.f('uq_webhook_messages_endpoint_id_notification_id')),
    sa.UniqueConstraint('msg_id', name=op.f('uq_webhook_messages_msg_id'))
    )
    op.create_index('ix_webhook_messages_due', 'webhook_messages', ['next_attempt_at', 'id'], unique=False, postgresql_where=sa.text("status = 'pending'"))
    op.create_index('ix_webhook_messages_endpoint_id_id', 'webhook_messages', ['endpoint_id', 'id'], unique=False)
    op.create_index('ix_webhook_messages_line', 'webhook_messages', ['endpoint_id', 'run_id', 'notification_id'], unique=False, postgresql_where=sa.text("status = 'pending'"))
    op.create_index('ix_webhook_messages_notification_id', 'webhook_messages', ['notification_id'], unique=False)
    op.create_table('webhook_attempts',
    sa.Column('id', sa.BigInteger(), nullable=False),
    sa.Column('message_id', sa.BigInteger(), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('outcome', sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('status_code', sa.Integer(), nullable=True),
    sa.Column('latency_ms', sa.Integer(), nullable=False),
    sa.Column('response_excerpt', sqlmodel.sql.sqltypes.AutoString(length=500), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.CheckConstraint("outcome IN ('delivered', 'failed')", name=op.f('ck_webhook_attempts_outcome_known')),
    sa.ForeignKeyConstraint(['message_id'], ['webhook_messages.id'], name=op.f('fk_webhook_attempts_message_id_webhook_messages'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_webhook_attempts')),
    sa.UniqueConstraint('message_id', 'attempt', name=op.f('uq_webhook_attempts_message_id_attempt'))
    )
    op.execute("INSERT INTO webhook_fanout (name, fanned_out_to) "
               "SELECT 'notifications', coalesce(max(id), 0) FROM notifications")


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_table('webhook_attempts')
    op.drop_index('ix_webhook_messages_notification_id', table_name='webhook_messages')
    op.drop_index('ix_webhook_messages_line', table_name='webhook_messages', postgresql_where=sa.text("status = 'pending'"))
    op.drop_index('ix_webhook_messages_endpoint_id_id', table_name='webhook_messages')
    op.drop_index('ix_webhook_messages_due', table_name='webhook_messages', postgresql_where=sa.text("status = 'pending'"))
    op.drop_table('webhook_messages')
    op.drop_index('ix_webhook_endpoints_tenant_id_created_at', table_name='webhook_endpoints')
    op.drop_table('webhook_endpoints')
    op.drop_table('webhook_fanout')
