"""runs.announced_status and statement_closings: what a tenant was told, so it is told once

``runs.announced_status`` holds the status words last announced (``run.status_changed``):
ingest compares a run's new words with them only when its events can change them, instead
of recomputing every run's words for every event. Runs stored before keep NULL (nothing
announced yet); their next change is announced with no previous words.

``statement_closings`` holds one row per (tenant, customer, period) whose statement closed
and was announced (``statement.closed``): its primary key makes that happen once, whatever
number of beats try at the same moment.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01 22:00:00.000000

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa
import sqlmodel  # noqa: F401  (autogenerate renders sqlmodel.AutoString)


# revision identifiers, used by Alembic.
revision: str = '0014'
down_revision: Union[str, Sequence[str], None] = '0013'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    op.add_column('runs', sa.Column('announced_status', sqlmodel.sql.sqltypes.AutoString(length=64), nullable=True))
    op.create_table('statement_closings',
    sa.Column('tenant_id', sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
    sa.Column('customer_id', sqlmodel.sql.sqltypes.AutoString(length=128), nullable=False),
    sa.Column('period', sqlmodel.sql.sqltypes.AutoString(length=7), nullable=False),
    sa.Column('gross_micros', sa.BigInteger(), nullable=False),
    sa.Column('billed_micros', sa.BigInteger(), nullable=False),
    sa.Column('credited_micros', sa.BigInteger(), nullable=False),
    sa.Column('held_micros', sa.BigInteger(), nullable=False),
    sa.Column('runs', sa.Integer(), nullable=False),
    sa.Column('closed_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['tenant_id', 'customer_id'], ['customers.tenant_id', 'customers.id'], name=op.f('fk_statement_closings_tenant_id_customer_id_customers')),
    sa.PrimaryKeyConstraint('tenant_id', 'customer_id', 'period', name=op.f('pk_statement_closings'))
    )


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_table('statement_closings')
    op.drop_column('runs', 'announced_status')
