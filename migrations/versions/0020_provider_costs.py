"""provider costs: what each model costs the platform, beside the price catalog (issue #17)

Same shape as ``prices`` (model, token class, micro-USD per million tokens, effective
from), a table of its own. Read only by the cost of protection report.

Revision ID: 0020
Revises: 0018
Create Date: 2026-12-02 01:30:00.000000

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa
import sqlmodel  # noqa: F401  (autogenerate renders sqlmodel.AutoString)


# revision identifiers, used by Alembic.
revision: str = '0020'
down_revision: Union[str, Sequence[str], None] = '0018'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table('provider_costs',
    sa.Column('id', sa.BigInteger(), nullable=False),
    sa.Column('model', sqlmodel.sql.sqltypes.AutoString(length=128), nullable=False),
    sa.Column('token_class', sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
    sa.Column('micros_per_mtok', sa.BigInteger(), nullable=False),
    sa.Column('effective_from', sa.DateTime(timezone=True), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint("token_class IN ('input', 'cached_input', 'output')", name=op.f('ck_provider_costs_token_class_known')),
    sa.CheckConstraint('micros_per_mtok >= 0', name=op.f('ck_provider_costs_cost_not_negative')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_provider_costs')),
    sa.UniqueConstraint('model', 'token_class', 'effective_from', name=op.f('uq_provider_costs_model_token_class_effective_from'))
    )


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_table('provider_costs')
