"""stripe_customer_leases: one Stripe sender per customer, from planning until recorded
(issue #29)

A claim skipped customers with a claimed *pending* row; superseding a row in flight made it
not pending, so a second pusher planned the correction without the call still in flight and
Stripe billed both. The lease is per customer, taken by the claim and held until the pusher
has recorded every result of that customer's calls, whatever the rows' status meanwhile
(metering/billing/claims.py). Rows only while held: the holder deletes its lease when done.

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-03 10:00:00

"""

from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = "0027"
down_revision: Union[str, Sequence[str], None] = "0026"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table(
        "stripe_customer_leases",
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("customer_id", sa.String(length=128), nullable=False),
        sa.Column("holder", sa.String(length=64), nullable=False),
        sa.Column("held_until", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id", "customer_id"],
            ["customers.tenant_id", "customers.id"],
            name=op.f("fk_stripe_customer_leases_tenant_id_customer_id_customers"),
        ),
        sa.PrimaryKeyConstraint("tenant_id", "customer_id", name=op.f("pk_stripe_customer_leases")),
    )


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_table("stripe_customer_leases")
