"""decisions keep the facts they were made on (a compact record)

Settlement has all of a run's facts in memory when it decides it. Kept on the decision as
one MessagePack value (``metering/settlement/decided_facts.py``), they let a what-if replay
(issue #17) read one value per run instead of some twenty rows scattered over the events and
usage-line tables. NULL for decisions made before this revision (and for the rare run whose
event data MessagePack cannot carry): those are replayed from the tables, as before.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-02 09:00:00

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = '0022'
down_revision: Union[str, Sequence[str], None] = '0021'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    op.add_column('decisions', sa.Column('facts', sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_column('decisions', 'facts')
