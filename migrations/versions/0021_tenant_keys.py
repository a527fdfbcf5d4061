"""tenant keys: every primary key, unique key and foreign key includes tenant_id (issue #18)

Ready to shard by tenant: a distributed database (Citus, docs/scaling.md) can only enforce
a key whose columns include the distribution column, and can only join two tables locally
when their foreign key carries it. So every tenant table is re-keyed here:

- the three child tables that had no ``tenant_id`` (usage lines, console sessions, webhook
  attempts) get one, filled from their parent, NOT NULL;
- primary keys ``(id)`` become ``(id, tenant_id)`` (and the few keyed otherwise take
  ``tenant_id`` last too); the id sequences stay as they are, so ids remain unique in
  practice, but the database now enforces them only together with the tenant;
- unique keys gain ``tenant_id`` as their last column, so the lookups by run, message or
  usage line that they serve keep their index (the event idempotency key ``(tenant_id,
  source, event_id)`` already had it and is untouched);
- foreign keys become composite ``(tenant_id, x_id) REFERENCES parent (tenant_id, id)``.

The tenant comes last in the new primary keys, as in the unique keys: every lookup by id
alone (a task given a run id, the outbox and webhook senders claiming rows by id, a console
session by its token, a key by its id) keeps its index, no index is added, and
``uq_runs_tenant_id_id`` and ``uq_webhook_endpoints_tenant_id_id`` go, the new primary keys
of their tables serving their foreign keys. Led by the tenant, the primary key competed
with the ``(tenant_id, …)`` indexes: on a table without statistics the planner took it for
the event idempotency probe and ingest ran 10 x slower (docs/scaling.md).

Reference tables (prices, provider costs) and the tables that are not a tenant's (the
Stripe account's mirror, the fan-out cursor) stay as they are: the allow-list, with the
reason for each, is in ``tests/integration/test_tenant_keys.py``.

Cost: one transaction that rebuilds the key indexes of every tenant table and backfills
``usage_lines`` under ACCESS EXCLUSIVE locks, so ingest and settlement wait for it: plan a
maintenance window on a large database. (Online, the same
change is: ``CREATE UNIQUE INDEX CONCURRENTLY`` each new key, then ``ADD CONSTRAINT … USING
INDEX``, foreign keys ``NOT VALID`` then ``VALIDATE CONSTRAINT``, each its own transaction.)

Downgrade restores the single-column keys. It works as long as the ids are still unique
across tenants, which the sequences guarantee unless rows were written with explicit ids.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-02 05:00:00.000000

"""
from typing import Sequence, Union

from alembic import op


# revision identifiers, used by Alembic.
revision: str = '0021'
down_revision: Union[str, Sequence[str], None] = '0020'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


# Child tables that gain tenant_id: (table, parent, child column, parent column).
NEW_TENANT_COLUMNS = (
    ("usage_lines", "runs", "run_id", "id"),
    ("console_sessions", "api_keys", "key_id", "key_id"),
    ("webhook_attempts", "webhook_messages", "message_id", "id"),
)

# Primary keys: table → (old columns, new columns), the tenant last. Names stay pk_<table>.
PRIMARY_KEYS = {
    "api_keys": (["key_id"], ["key_id", "tenant_id"]),
    "console_sessions": (["token_sha256"], ["token_sha256", "tenant_id"]),
    "runs": (["id"], ["id", "tenant_id"]),
    "events": (["id"], ["id", "tenant_id"]),
    "usage_lines": (["id"], ["id", "tenant_id"]),
    "ledger_entries": (["id"], ["id", "tenant_id"]),
    "decisions": (["id"], ["id", "tenant_id"]),
    "stripe_outbox": (["id"], ["id", "tenant_id"]),
    "stripe_deliveries": (["id"], ["id", "tenant_id"]),
    "statement_lines": (["run_id", "statement_period"], ["run_id", "statement_period", "tenant_id"]),
    "audit_log": (["id"], ["id", "tenant_id"]),
    "disputes": (["id"], ["id", "tenant_id"]),
    "support_credits": (["id"], ["id", "tenant_id"]),
    "notifications": (["id"], ["id", "tenant_id"]),
    "webhook_endpoints": (["id"], ["id", "tenant_id"]),
    "webhook_messages": (["id"], ["id", "tenant_id"]),
    "webhook_attempts": (["id"], ["id", "tenant_id"]),
    "policy_versions": (["id"], ["id", "tenant_id"]),
}

# Unique constraints: (table, old name, old columns, new name, new columns). A new name of
# None: the constraint goes (the new primary key is the same columns).
UNIQUES = (
    ("runs", "uq_runs_tenant_id_id", ["tenant_id", "id"], None, None),
    ("webhook_endpoints", "uq_webhook_endpoints_tenant_id_id", ["tenant_id", "id"], None, None),
    ("usage_lines", "uq_usage_lines_event_pk", ["event_pk"],
     "uq_usage_lines_event_pk_tenant_id", ["event_pk", "tenant_id"]),
    ("decisions", "uq_decisions_run_id_version", ["run_id", "version"],
     "uq_decisions_run_id_version_tenant_id", ["run_id", "version", "tenant_id"]),
    ("stripe_outbox", "uq_stripe_outbox_run_id_decision_version", ["run_id", "decision_version"],
     "uq_stripe_outbox_run_id_decision_version_tenant_id",
     ["run_id", "decision_version", "tenant_id"]),
    ("stripe_deliveries", "uq_stripe_deliveries_kind_identifier", ["kind", "identifier"],
     "uq_stripe_deliveries_kind_identifier_tenant_id", ["kind", "identifier", "tenant_id"]),
    ("support_credits", "uq_support_credits_run_id_grant_no", ["run_id", "grant_no"],
     "uq_support_credits_run_id_grant_no_tenant_id", ["run_id", "grant_no", "tenant_id"]),
    ("webhook_messages", "uq_webhook_messages_endpoint_id_notification_id",
     ["endpoint_id", "notification_id"],
     "uq_webhook_messages_endpoint_id_notification_id_tenant_id",
     ["endpoint_id", "notification_id", "tenant_id"]),
    ("webhook_messages", "uq_webhook_messages_msg_id", ["msg_id"],
     "uq_webhook_messages_msg_id_tenant_id", ["msg_id", "tenant_id"]),
    ("webhook_attempts", "uq_webhook_attempts_message_id_attempt", ["message_id", "attempt"],
     "uq_webhook_attempts_message_id_attempt_tenant_id", ["message_id", "attempt", "tenant_id"]),
)

# Partial unique indexes of the ledger (same names, tenant_id last, as for the unique keys).
LEDGER_HOLD = "uq_ledger_entries_hold_usage_line"
LEDGER_POSTING = "uq_ledger_entries_decision_posting"

# Foreign keys: (table, old name, old columns, new name, new columns, parent, old parent
# columns, new parent columns, ON DELETE). Those whose columns do not change are dropped and
# re-made all the same: they point at a unique key that this migration replaces.
_FK = tuple[str, str, list[str], str, list[str], str, list[str], list[str], str]
FOREIGN_KEYS: tuple[_FK, ...] = (
    ("events", "fk_events_tenant_id_run_id_runs", ["tenant_id", "run_id"],
     "fk_events_tenant_id_run_id_runs", ["tenant_id", "run_id"],
     "runs", ["tenant_id", "id"], ["tenant_id", "id"], ""),
    ("usage_lines", "fk_usage_lines_event_pk_events", ["event_pk"],
     "fk_usage_lines_tenant_id_event_pk_events", ["tenant_id", "event_pk"],
     "events", ["id"], ["tenant_id", "id"], ""),
    ("usage_lines", "fk_usage_lines_run_id_runs", ["run_id"],
     "fk_usage_lines_tenant_id_run_id_runs", ["tenant_id", "run_id"],
     "runs", ["id"], ["tenant_id", "id"], ""),
    ("ledger_entries", "fk_ledger_entries_usage_line_id_usage_lines", ["usage_line_id"],
     "fk_ledger_entries_tenant_id_usage_line_id_usage_lines", ["tenant_id", "usage_line_id"],
     "usage_lines", ["id"], ["tenant_id", "id"], ""),
    ("decisions", "fk_decisions_run_id_runs", ["run_id"],
     "fk_decisions_tenant_id_run_id_runs", ["tenant_id", "run_id"],
     "runs", ["id"], ["tenant_id", "id"], ""),
    ("stripe_outbox", "fk_stripe_outbox_run_id_runs", ["run_id"],
     "fk_stripe_outbox_tenant_id_run_id_runs", ["tenant_id", "run_id"],
     "runs", ["id"], ["tenant_id", "id"], ""),
    ("stripe_deliveries", "fk_stripe_deliveries_outbox_id_stripe_outbox", ["outbox_id"],
     "fk_stripe_deliveries_tenant_id_outbox_id_stripe_outbox", ["tenant_id", "outbox_id"],
     "stripe_outbox", ["id"], ["tenant_id", "id"], ""),
    ("stripe_deliveries", "fk_stripe_deliveries_run_id_runs", ["run_id"],
     "fk_stripe_deliveries_tenant_id_run_id_runs", ["tenant_id", "run_id"],
     "runs", ["id"], ["tenant_id", "id"], ""),
    ("statement_lines", "fk_statement_lines_run_id_runs", ["run_id"],
     "fk_statement_lines_tenant_id_run_id_runs", ["tenant_id", "run_id"],
     "runs", ["id"], ["tenant_id", "id"], ""),
    ("disputes", "fk_disputes_run_id_runs", ["run_id"],
     "fk_disputes_tenant_id_run_id_runs", ["tenant_id", "run_id"],
     "runs", ["id"], ["tenant_id", "id"], ""),
    ("console_sessions", "fk_console_sessions_key_id_api_keys", ["key_id"],
     "fk_console_sessions_tenant_id_key_id_api_keys", ["tenant_id", "key_id"],
     "api_keys", ["key_id"], ["tenant_id", "key_id"], ""),
    ("notifications", "fk_notifications_run_id_runs", ["run_id"],
     "fk_notifications_tenant_id_run_id_runs", ["tenant_id", "run_id"],
     "runs", ["id"], ["tenant_id", "id"], ""),
    ("webhook_messages", "fk_webhook_messages_notification_id_notifications", ["notification_id"],
     "fk_webhook_messages_tenant_id_notification_id_notifications",
     ["tenant_id", "notification_id"],
     "notifications", ["id"], ["tenant_id", "id"], ""),
    ("webhook_messages", "fk_webhook_messages_tenant_id_endpoint_id_webhook_endpoints",
     ["tenant_id", "endpoint_id"],
     "fk_webhook_messages_tenant_id_endpoint_id_webhook_endpoints", ["tenant_id", "endpoint_id"],
     "webhook_endpoints", ["tenant_id", "id"], ["tenant_id", "id"], "CASCADE"),
    ("webhook_attempts", "fk_webhook_attempts_message_id_webhook_messages", ["message_id"],
     "fk_webhook_attempts_tenant_id_message_id_webhook_messages", ["tenant_id", "message_id"],
     "webhook_messages", ["id"], ["tenant_id", "id"], "CASCADE"),
)

def _cols(columns: list[str]) -> str:
    return ", ".join(columns)


def _drop_fks(new: bool) -> None:
    for table, old_name, _, new_name, *_ in FOREIGN_KEYS:
        op.execute(f"ALTER TABLE {table} DROP CONSTRAINT {new_name if new else old_name}")


def _add_fks(new: bool) -> None:
    for table, old_name, old_cols, new_name, new_cols, parent, old_p, new_p, on_delete in (
        FOREIGN_KEYS
    ):
        name, cols, parent_cols = (
            (new_name, new_cols, new_p) if new else (old_name, old_cols, old_p)
        )
        action = f" ON DELETE {on_delete}" if on_delete else ""
        op.execute(
            f"ALTER TABLE {table} ADD CONSTRAINT {name} FOREIGN KEY ({_cols(cols)}) "
            f"REFERENCES {parent} ({_cols(parent_cols)}){action}"
        )


def _swap_keys(new: bool) -> None:
    """Primary keys and unique keys from the old columns to the new (or back)."""
    for table, (old_cols, new_cols) in PRIMARY_KEYS.items():
        cols = new_cols if new else old_cols
        op.execute(
            f"ALTER TABLE {table} DROP CONSTRAINT pk_{table}, "
            f"ADD CONSTRAINT pk_{table} PRIMARY KEY ({_cols(cols)})"
        )
    for table, old_name, old_cols, new_name, new_cols in UNIQUES:
        drop, (add_name, add_cols) = (
            (old_name, (new_name, new_cols)) if new else (new_name, (old_name, old_cols))
        )
        if drop is not None:
            op.execute(f"ALTER TABLE {table} DROP CONSTRAINT {drop}")
        if add_name is not None:
            op.execute(
                f"ALTER TABLE {table} ADD CONSTRAINT {add_name} UNIQUE ({_cols(add_cols)})"
            )
    tenant = ", tenant_id" if new else ""
    op.execute(f"DROP INDEX {LEDGER_HOLD}")
    op.execute(
        f"CREATE UNIQUE INDEX {LEDGER_HOLD} ON ledger_entries (usage_line_id{tenant}) "
        "WHERE kind = 'hold'"
    )
    op.execute(f"DROP INDEX {LEDGER_POSTING}")
    op.execute(
        f"CREATE UNIQUE INDEX {LEDGER_POSTING} ON ledger_entries "
        f"(run_id, decision_version, kind, corrects{tenant}) NULLS NOT DISTINCT "
        "WHERE kind <> 'hold'"
    )


def upgrade() -> None:
    """Upgrade schema."""
    for table, parent, column, parent_column in NEW_TENANT_COLUMNS:
        op.execute(f"ALTER TABLE {table} ADD COLUMN tenant_id VARCHAR(64)")
        # usage_lines is append-only: its trigger is lifted for this one backfill.
        if table == "usage_lines":
            op.execute("ALTER TABLE usage_lines DISABLE TRIGGER usage_lines_append_only")
        op.execute(
            f"UPDATE {table} c SET tenant_id = p.tenant_id FROM {parent} p "
            f"WHERE p.{parent_column} = c.{column}"
        )
        if table == "usage_lines":
            op.execute("ALTER TABLE usage_lines ENABLE TRIGGER usage_lines_append_only")
        op.execute(f"ALTER TABLE {table} ALTER COLUMN tenant_id SET NOT NULL")
    _drop_fks(new=False)
    _swap_keys(new=True)
    _add_fks(new=True)


def downgrade() -> None:
    """Downgrade schema."""
    _drop_fks(new=True)
    _swap_keys(new=False)
    _add_fks(new=False)
    for table, *_ in NEW_TENANT_COLUMNS:
        op.execute(f"ALTER TABLE {table} DROP COLUMN tenant_id")
