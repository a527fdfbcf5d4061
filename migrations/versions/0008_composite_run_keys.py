"""composite run keys: events and ledger entries must share their run's tenant (and customer)

Each event and ledger entry had one foreign key to ``runs`` and one to ``tenants``, and
nothing tied the two together: an entry of tenant A could name a run of tenant B, or
another customer's run. One composite key per row replaces both, so the database refuses
such a row, and each inserted row costs one key check instead of two (ingest writes two
such rows per usage event; see docs/benchmarks.md).

Adding the keys checks every existing event and ledger entry once, under a lock that
holds writes to those tables for the duration of the migration.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 10:24:42.676920

"""

from typing import Sequence, Union

from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0008"
down_revision: Union[str, Sequence[str], None] = "0007"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_unique_constraint(op.f("uq_runs_tenant_id_id"), "runs", ["tenant_id", "id"])
    op.create_unique_constraint(
        op.f("uq_runs_tenant_id_customer_id_id"), "runs", ["tenant_id", "customer_id", "id"]
    )
    op.drop_constraint(op.f("fk_events_run_id_runs"), "events", type_="foreignkey")
    op.drop_constraint(op.f("fk_events_tenant_id_tenants"), "events", type_="foreignkey")
    op.create_foreign_key(
        op.f("fk_events_tenant_id_run_id_runs"),
        "events",
        "runs",
        ["tenant_id", "run_id"],
        ["tenant_id", "id"],
    )
    op.drop_constraint(
        op.f("fk_ledger_entries_tenant_id_tenants"), "ledger_entries", type_="foreignkey"
    )
    op.drop_constraint(op.f("fk_ledger_entries_run_id_runs"), "ledger_entries", type_="foreignkey")
    op.create_foreign_key(
        op.f("fk_ledger_entries_tenant_id_customer_id_run_id_runs"),
        "ledger_entries",
        "runs",
        ["tenant_id", "customer_id", "run_id"],
        ["tenant_id", "customer_id", "id"],
    )


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_constraint(
        op.f("fk_ledger_entries_tenant_id_customer_id_run_id_runs"),
        "ledger_entries",
        type_="foreignkey",
    )
    op.create_foreign_key(
        op.f("fk_ledger_entries_run_id_runs"), "ledger_entries", "runs", ["run_id"], ["id"]
    )
    op.create_foreign_key(
        op.f("fk_ledger_entries_tenant_id_tenants"),
        "ledger_entries",
        "tenants",
        ["tenant_id"],
        ["id"],
    )
    op.drop_constraint(op.f("fk_events_tenant_id_run_id_runs"), "events", type_="foreignkey")
    op.create_foreign_key(
        op.f("fk_events_tenant_id_tenants"), "events", "tenants", ["tenant_id"], ["id"]
    )
    op.create_foreign_key(op.f("fk_events_run_id_runs"), "events", "runs", ["run_id"], ["id"])
    op.drop_constraint(op.f("uq_runs_tenant_id_customer_id_id"), "runs", type_="unique")
    op.drop_constraint(op.f("uq_runs_tenant_id_id"), "runs", type_="unique")
