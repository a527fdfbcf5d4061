"""policy_withdrawals: an admin withdraws a policy version before it takes effect (issue #30)

A version scheduled with a mistyped ``effective_from`` (9999 for 2026) could not be undone:
versions are append-only and every later version must start after it. A withdrawal is its
own append-only row, one per version, so the version is never edited and the withdrawal
stays recorded (who, when, why). Keyed by tenant like every table; no foreign key to
policy_versions, whose append-only trigger must stay what refuses a TRUNCATE of it.

Revision ID: 0030
Revises: 0029
Create Date: 2026-12-03 13:40:00

"""

from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = "0030"
down_revision: Union[str, Sequence[str], None] = "0029"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table(
        "policy_withdrawals",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column(
            "withdrawn_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("withdrawn_by", sa.String(length=128), nullable=False),
        sa.Column("reason", sa.Text(), server_default="", nullable=False),
        sa.PrimaryKeyConstraint("id", "tenant_id", name=op.f("pk_policy_withdrawals")),
        sa.UniqueConstraint(
            "tenant_id", "version", name=op.f("uq_policy_withdrawals_tenant_id_version")
        ),
    )
    op.execute(
        "CREATE TRIGGER policy_withdrawals_append_only BEFORE UPDATE OR DELETE "
        "ON policy_withdrawals FOR EACH ROW EXECUTE FUNCTION fairmeter_refuse_edit()"
    )
    op.execute(
        "CREATE TRIGGER policy_withdrawals_no_truncate BEFORE TRUNCATE ON policy_withdrawals "
        "FOR EACH STATEMENT EXECUTE FUNCTION fairmeter_refuse_edit()"
    )


def downgrade() -> None:
    """Downgrade schema."""
    op.execute("DROP TRIGGER IF EXISTS policy_withdrawals_no_truncate ON policy_withdrawals")
    op.execute("DROP TRIGGER IF EXISTS policy_withdrawals_append_only ON policy_withdrawals")
    op.drop_table("policy_withdrawals")
