"""stripe invoices and credit notes: periods stay open until their invoice is finalized

The planner needs to know which invoice periods Stripe has finalized (from the invoice
webhooks), deliveries can be credit notes (with the invoice, its currency and the amount in
that currency) or rejections Stripe reported after accepting an event, and an outbox row
resent after reconciling goes out under a new generation of keys and identifiers.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01 18:40:00.000000

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa
import sqlmodel  # noqa: F401  (autogenerate renders sqlmodel.AutoString)


# revision identifiers, used by Alembic.
revision: str = '0012'
down_revision: Union[str, Sequence[str], None] = '0011'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

OLD_KINDS = "kind IN ('meter_event', 'meter_cancel', 'balance_credit')"
NEW_KINDS = (
    "kind IN ('meter_event', 'meter_cancel', 'meter_rejected', 'credit_note', 'balance_credit')"
)


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table('stripe_invoices',
    sa.Column('invoice_id', sqlmodel.sql.sqltypes.AutoString(length=255), nullable=False),
    sa.Column('stripe_customer_id', sqlmodel.sql.sqltypes.AutoString(length=255), nullable=False),
    sa.Column('currency', sqlmodel.sql.sqltypes.AutoString(length=3), nullable=False),
    sa.Column('status', sqlmodel.sql.sqltypes.AutoString(length=20), nullable=False),
    sa.Column('period_start', sa.DateTime(timezone=True), nullable=False),
    sa.Column('period_end', sa.DateTime(timezone=True), nullable=False),
    sa.Column('finalizes_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finalized_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('paid_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('invoice_id', name=op.f('pk_stripe_invoices'))
    )
    op.create_index(op.f('ix_stripe_invoices_stripe_customer_id'), 'stripe_invoices', ['stripe_customer_id'], unique=False)
    op.add_column('stripe_outbox', sa.Column('generation', sa.Integer(), server_default='0', nullable=False))
    op.add_column('stripe_outbox', sa.Column('first_attempt_at', sa.DateTime(timezone=True), nullable=True))
    op.add_column('stripe_deliveries', sa.Column('invoice_id', sqlmodel.sql.sqltypes.AutoString(length=255), nullable=True))
    op.add_column('stripe_deliveries', sa.Column('currency', sqlmodel.sql.sqltypes.AutoString(length=3), nullable=True))
    op.add_column('stripe_deliveries', sa.Column('amount_minor', sa.BigInteger(), nullable=True))
    op.drop_constraint(op.f('ck_stripe_deliveries_kind_known'), 'stripe_deliveries', type_='check')
    op.create_check_constraint(op.f('ck_stripe_deliveries_kind_known'), 'stripe_deliveries', NEW_KINDS)


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_constraint(op.f('ck_stripe_deliveries_kind_known'), 'stripe_deliveries', type_='check')
    op.create_check_constraint(op.f('ck_stripe_deliveries_kind_known'), 'stripe_deliveries', OLD_KINDS)
    op.drop_column('stripe_deliveries', 'amount_minor')
    op.drop_column('stripe_deliveries', 'currency')
    op.drop_column('stripe_deliveries', 'invoice_id')
    op.drop_column('stripe_outbox', 'first_attempt_at')
    op.drop_column('stripe_outbox', 'generation')
    op.drop_index(op.f('ix_stripe_invoices_stripe_customer_id'), table_name='stripe_invoices')
    op.drop_table('stripe_invoices')
