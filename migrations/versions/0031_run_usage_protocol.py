"""runs.usage_protocol: the one ingest protocol a run's usage comes through (issue #30)

The same model call sent once as a CloudEvent (POST /v1/events) and once as an OTLP span
(POST /v1/traces) has two different event ids, so idempotency cannot see it and the call is
charged twice. Ingest records here which protocol brought a run's first usage and refuses
usage through the other one (docs/otlp.md, "One path per run"). NULL until the run's first
usage, and for runs stored before this revision: their next usage decides.

Revision ID: 0031
Revises: 0030
Create Date: 2026-12-03 13:15:00

"""

from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = "0031"
down_revision: Union[str, Sequence[str], None] = "0030"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    # A nullable column without a default: a catalogue-only change, no table rewrite.
    op.add_column("runs", sa.Column("usage_protocol", sa.String(16), nullable=True))
    op.create_check_constraint(
        op.f("ck_runs_usage_protocol_known"),
        "runs",
        "usage_protocol IN ('cloudevents', 'otlp')",
    )


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_constraint(op.f("ck_runs_usage_protocol_known"), "runs", type_="check")
    op.drop_column("runs", "usage_protocol")
