"""support credits: each credit a row, of the usage the run had when it was granted

Support credits were one running total on the run, applied to whatever settlement billed:
concurrent credits added up past the run's gross, and the surplus then refunded usage that
arrived later. Each credit is now an append-only row recording its amount and the usage
lines it covers, so settlement never lets a credit reach later usage, and the cumulative
support limits (per run, per customer per UTC day) can be summed.

Existing totals become one credit each, covering the run's lines as they are now and
capped at the run's gross (a surplus from the old race never applied to anything billed).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 18:10:00.000000

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa
import sqlmodel  # noqa: F401  (autogenerate renders sqlmodel.AutoString)


# revision identifiers, used by Alembic.
revision: str = '0010'
down_revision: Union[str, Sequence[str], None] = '0009'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

BACKFILL = """
WITH totals AS (
    SELECT r.id, r.tenant_id, r.customer_id, r.subject,
           least(r.support_credit_micros, r.gross_micros) AS amount_micros
    FROM runs r WHERE r.support_credit_micros > 0
),
granted AS (
    INSERT INTO support_credits (tenant_id, customer_id, run_id, grant_no, amount_micros,
                                 covers_line_id, granted_by, granted_by_scope, granted_at)
    SELECT t.tenant_id, t.customer_id, t.id, 1, t.amount_micros,
           (SELECT coalesce(max(l.id), 0) FROM usage_lines l WHERE l.run_id = t.id),
           'migration-0010', 'admin',
           coalesce((SELECT max(a.created_at) FROM audit_log a
                     WHERE a.tenant_id = t.tenant_id AND a.target_id = t.subject
                       AND a.action IN ('run.credit', 'dispute.approve')), now())
    FROM totals t WHERE t.amount_micros > 0
)
UPDATE runs SET support_credit_micros = t.amount_micros FROM totals t WHERE runs.id = t.id
"""


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table('support_credits',
    sa.Column('id', sa.BigInteger(), nullable=False),
    sa.Column('tenant_id', sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
    sa.Column('customer_id', sqlmodel.sql.sqltypes.AutoString(length=128), nullable=False),
    sa.Column('run_id', sa.BigInteger(), nullable=False),
    sa.Column('grant_no', sa.Integer(), nullable=False),
    sa.Column('amount_micros', sa.BigInteger(), nullable=False),
    sa.Column('covers_line_id', sa.BigInteger(), nullable=False),
    sa.Column('granted_by', sqlmodel.sql.sqltypes.AutoString(length=128), nullable=False),
    sa.Column('granted_by_scope', sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
    sa.Column('granted_at', sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint('amount_micros > 0', name=op.f('ck_support_credits_amount_positive')),
    sa.CheckConstraint('grant_no >= 1 AND covers_line_id >= 0', name=op.f('ck_support_credits_numbers_valid')),
    sa.ForeignKeyConstraint(['tenant_id', 'customer_id', 'run_id'], ['runs.tenant_id', 'runs.customer_id', 'runs.id'], name=op.f('fk_support_credits_tenant_id_customer_id_run_id_runs')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_support_credits')),
    sa.UniqueConstraint('run_id', 'grant_no', name=op.f('uq_support_credits_run_id_grant_no'))
    )
    op.create_index('ix_support_credits_tenant_id_customer_id_granted_at', 'support_credits', ['tenant_id', 'customer_id', 'granted_at'], unique=False)
    op.execute("CREATE TRIGGER support_credits_append_only BEFORE UPDATE OR DELETE ON support_credits "
               "FOR EACH ROW EXECUTE FUNCTION fairmeter_refuse_edit()")
    op.execute(BACKFILL)


def downgrade() -> None:
    """Downgrade schema."""
    op.execute("DROP TRIGGER IF EXISTS support_credits_append_only ON support_credits")
    op.drop_index('ix_support_credits_tenant_id_customer_id_granted_at', table_name='support_credits')
    op.drop_table('support_credits')
