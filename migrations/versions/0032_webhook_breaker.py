"""webhook_endpoints: the circuit breaker's state (issue #30)

``breaker_failures``: failed attempts in a row since the last answered one (a timeout, a
refused connection, a 5xx); ``breaker_open_until``: no send to the endpoint before then.
The rule that reads them is metering/webhooks/breaker.py; docs/webhooks.md explains it.

Revision ID: 0032
Revises: 0029
Create Date: 2026-12-03 13:30:00

"""

from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = "0032"
down_revision: Union[str, Sequence[str], None] = "0031"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    op.add_column(
        "webhook_endpoints",
        sa.Column("breaker_failures", sa.Integer(), nullable=False, server_default="0"),
    )
    op.add_column(
        "webhook_endpoints",
        sa.Column("breaker_open_until", sa.DateTime(timezone=True), nullable=True),
    )


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_column("webhook_endpoints", "breaker_open_until")
    op.drop_column("webhook_endpoints", "breaker_failures")
