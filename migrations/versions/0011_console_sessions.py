"""console sessions: server-side, so sign-out and key revocation end them

The console cookie was a signed, self-contained token: it kept working after sign-out, and
whoever knew the pepper could mint one from a key id. Now the cookie holds a random token
and this table the SHA-256 of each live one.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01 18:10:00.000000

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa
import sqlmodel  # noqa: F401  (autogenerate renders sqlmodel.AutoString)


# revision identifiers, used by Alembic.
revision: str = '0011'
down_revision: Union[str, Sequence[str], None] = '0010'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table('console_sessions',
    sa.Column('token_sha256', sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
    sa.Column('key_id', sqlmodel.sql.sqltypes.AutoString(length=32), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['key_id'], ['api_keys.key_id'], name=op.f('fk_console_sessions_key_id_api_keys')),
    sa.PrimaryKeyConstraint('token_sha256', name=op.f('pk_console_sessions'))
    )
    op.create_index(op.f('ix_console_sessions_key_id'), 'console_sessions', ['key_id'], unique=False)


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_index(op.f('ix_console_sessions_key_id'), table_name='console_sessions')
    op.drop_table('console_sessions')
