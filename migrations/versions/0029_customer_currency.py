"""customers: the billing currency and the price of one meter unit in it (issue #29)

The ledger is micro-USD; an invoice may be in EUR. The conversion is the Stripe price of one
meter unit in the invoice's currency (docs/stripe.md, "Currency"), learned from the
customer's invoices or told by the operator. All three columns stay NULL until it is known;
a rate is stored whole (currency, price and the moment it was learned) or not at all.

Revision ID: 0029
Revises: 0028
Create Date: 2026-12-03 10:15:00

"""

from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = "0029"
down_revision: Union[str, Sequence[str], None] = "0028"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    op.add_column("customers", sa.Column("billing_currency", sa.String(3), nullable=True))
    op.add_column(
        "customers", sa.Column("billing_unit_amount_decimal", sa.Numeric(), nullable=True)
    )
    op.add_column(
        "customers",
        sa.Column("billing_rate_since", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_check_constraint(
        op.f("ck_customers_billing_rate_whole"),
        "customers",
        "(billing_currency IS NULL) = (billing_unit_amount_decimal IS NULL) "
        "AND (billing_currency IS NULL) = (billing_rate_since IS NULL)",
    )
    op.create_check_constraint(
        op.f("ck_customers_billing_currency_iso"),
        "customers",
        "billing_currency ~ '^[a-z]{3}$' AND billing_unit_amount_decimal >= 0",
    )


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_constraint(op.f("ck_customers_billing_currency_iso"), "customers", type_="check")
    op.drop_constraint(op.f("ck_customers_billing_rate_whole"), "customers", type_="check")
    for name in ("billing_rate_since", "billing_unit_amount_decimal", "billing_currency"):
        op.drop_column("customers", name)
