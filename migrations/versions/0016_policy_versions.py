"""policy versions: tenants' protection policies, and the version each decision was made under

Each tenant may write versions of its policy document (issue #17); the version in force at a
run's end decides it, and every decision records which one did. Decisions made before this
revision were made under the settings, which is version 0. The column has a server default
of 0, so existing (append-only) decisions get it without an UPDATE.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-02 01:10:00

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa
import sqlmodel  # noqa: F401  (autogenerate renders sqlmodel.AutoString)
from sqlalchemy.dialects import postgresql


# revision identifiers, used by Alembic.
revision: str = '0016'
down_revision: Union[str, Sequence[str], None] = '0015'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table('policy_versions',
    sa.Column('id', sa.BigInteger(), nullable=False),
    sa.Column('tenant_id', sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('document', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('effective_from', sa.DateTime(timezone=True), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('created_by', sqlmodel.sql.sqltypes.AutoString(length=128), nullable=False),
    sa.Column('note', sa.Text(), server_default='', nullable=False),
    sa.CheckConstraint('version >= 1', name=op.f('ck_policy_versions_version_positive')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_policy_versions')),
    sa.UniqueConstraint('tenant_id', 'version', name=op.f('uq_policy_versions_tenant_id_version'))
    )
    op.create_index('ix_policy_versions_tenant_id_effective_from', 'policy_versions', ['tenant_id', 'effective_from'], unique=False)
    op.execute("CREATE TRIGGER policy_versions_append_only BEFORE UPDATE OR DELETE ON policy_versions "
               "FOR EACH ROW EXECUTE FUNCTION fairmeter_refuse_edit()")
    # Row triggers do not see TRUNCATE; a statement trigger refuses it too.
    op.execute("CREATE TRIGGER policy_versions_no_truncate BEFORE TRUNCATE ON policy_versions "
               "FOR EACH STATEMENT EXECUTE FUNCTION fairmeter_refuse_edit()")
    op.add_column('decisions', sa.Column('policy_version', sa.Integer(), server_default='0', nullable=False))


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_column('decisions', 'policy_version')
    op.execute("DROP TRIGGER IF EXISTS policy_versions_no_truncate ON policy_versions")
    op.execute("DROP TRIGGER IF EXISTS policy_versions_append_only ON policy_versions")
    op.drop_index('ix_policy_versions_tenant_id_effective_from', table_name='policy_versions')
    op.drop_table('policy_versions')
