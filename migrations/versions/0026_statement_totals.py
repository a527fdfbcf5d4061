"""statement_totals: a statement's sums kept by settlement, so its totals and chart read a
few dozen rows instead of every line of the customer's month (issue #18)

Summed over ``statement_lines`` on each view, a customer with 100,000 runs in a month took
121 ms (docs/benchmarks.md, "Growth"). The sums are keyed by what a statement filters and
charts on: kind, outcome, the day the run ended and the day the line is charted on
(metering/statements/totals.py). Filled here from the lines already written.

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-02 16:00:00

"""

from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = "0026"
down_revision: Union[str, Sequence[str], None] = "0025"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table(
        "statement_totals",
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("customer_id", sa.String(length=128), nullable=False),
        sa.Column("statement_period", sa.String(length=7), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("outcome", sa.String(length=32), nullable=False),
        sa.Column("ended_on", sa.Date(), nullable=False),
        sa.Column("charted_on", sa.Date(), nullable=False),
        sa.Column("gross_micros", sa.BigInteger(), nullable=False),
        sa.Column("billed_micros", sa.BigInteger(), nullable=False),
        sa.Column("credited_micros", sa.BigInteger(), nullable=False),
        sa.Column("lines", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint(
            "tenant_id",
            "customer_id",
            "statement_period",
            "kind",
            "outcome",
            "ended_on",
            "charted_on",
            name=op.f("pk_statement_totals"),
        ),
    )
    # As metering/statements/totals.py sums a line (kept here as it was at this revision).
    op.execute(
        """
        INSERT INTO statement_totals (tenant_id, customer_id, statement_period, kind, outcome,
            ended_on, charted_on, gross_micros, billed_micros, credited_micros, lines)
        SELECT l.tenant_id, l.customer_id, l.statement_period, l.kind, l.outcome,
               (l.ended_at AT TIME ZONE 'UTC')::date,
               ((CASE WHEN l.kind = 'correction' THEN l.decided_at ELSE l.ended_at END)
                AT TIME ZONE 'UTC')::date,
               sum(l.gross_abs - l.base_gross), sum(l.billed_abs - l.base_billed),
               sum(l.credited_abs - l.base_credited), count(*)
        FROM statement_lines l
        GROUP BY 1, 2, 3, 4, 5, 6, 7
        """
    )


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_table("statement_totals")
