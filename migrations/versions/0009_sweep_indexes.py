"""sweep indexes: a sweep reads the due runs, not every run in flight

Each sweep (every second by default) found due runs by evaluating the due time of every
pending run, and parked poison runs by reading them all again: with 200,000 runs in
flight, about 100 ms of PostgreSQL per sweep, growing with the backlog. With one index
per clock (idle, terminal, open drop) the claim is a union of range scans; the claimed
index serves the busy-customer check and the parking (only a claimed run has
attempts).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 10:47:27.793630

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa
import sqlmodel  # noqa: F401  (autogenerate renders sqlmodel.AutoString)


# revision identifiers, used by Alembic.
revision: str = '0009'
down_revision: Union[str, Sequence[str], None] = '0008'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_index('ix_runs_pending_claimed_until', 'runs', ['claimed_until'], unique=False, postgresql_where=sa.text('settled_evidence_version < evidence_version AND parked_at IS NULL AND claimed_until IS NOT NULL'))
    op.create_index('ix_runs_pending_last_lost_at', 'runs', ['last_lost_at'], unique=False, postgresql_where=sa.text('settled_evidence_version < evidence_version AND parked_at IS NULL AND last_lost_at IS NOT NULL'))
    op.create_index('ix_runs_pending_terminal_at', 'runs', ['terminal_at'], unique=False, postgresql_where=sa.text('settled_evidence_version < evidence_version AND parked_at IS NULL AND terminal_at IS NOT NULL'))


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_index('ix_runs_pending_terminal_at', table_name='runs', postgresql_where=sa.text('settled_evidence_version < evidence_version AND parked_at IS NULL AND terminal_at IS NOT NULL'))
    op.drop_index('ix_runs_pending_last_lost_at', table_name='runs', postgresql_where=sa.text('settled_evidence_version < evidence_version AND parked_at IS NULL AND last_lost_at IS NOT NULL'))
    op.drop_index('ix_runs_pending_claimed_until', table_name='runs', postgresql_where=sa.text('settled_evidence_version < evidence_version AND parked_at IS NULL AND claimed_until IS NOT NULL'))
