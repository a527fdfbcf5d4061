"""events, usage lines, ledger entries, decisions and Stripe deliveries partitioned by month
(issue #18); the keys that must hold forever move to two narrow tables

A partitioned table's primary and unique keys must include its partition key. Each of
these tables is partitioned by a time the server sets when it writes the row (never a
producer's clock, which could send a row to a month long archived or past every partition
made ahead), and each key either

- holds forever in a table of its own, not partitioned: ``event_keys (tenant_id, source,
  event_id)`` keeps an event idempotent (a re-sent event is a duplicate, a changed one a
  409) even after its month of raw events is archived and dropped, and
  ``stripe_delivery_keys (tenant_id, kind, identifier)`` keeps every Stripe delivery
  recorded once (a webhook or a retry arrives in another transaction, or another month); or
- takes the month and is still exact, because the rows it guards are written once, in
  one transaction whose clock they share: a usage line is written in the statement that
  writes its event (``received_at`` is the event's), a hold with its usage line, a decision
  and its postings under the run's row lock with the run's version counter.

Foreign keys into a partitioned table would have to carry the month, and would stop a
month of events being dropped while the ledger (kept for years) still names its lines:
``usage_lines → events`` and ``ledger_entries → usage_lines`` go; ingest writes event,
line and hold in one statement. Keys into ``runs``, ``stripe_outbox`` and ``tenants`` stay.

``usage_lines`` gains ``received_at`` (its event's), its partition key.

``fairmeter_ensure_month_partitions`` runs as its owner from now on (SECURITY DEFINER, with
a fixed search_path): only a table's owner may add a partition to it, and the beat that
makes next months' partitions connects as the application role, which owns nothing
(docs/deploy/init-app-role.sql). It can only add empty monthly partitions to the
partitioned tables; dropping one still needs the owner.

Rows are copied into the partitioned tables under ACCESS EXCLUSIVE locks: on a large
database plan a window (1 M events with their lines and holds took 96 s on a loaded
2-core host). Each table's months get a
partition from its oldest row to three months ahead, and a DEFAULT partition.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-02 12:10:00

"""
from dataclasses import dataclass
from typing import Sequence, Union

from alembic import op


# revision identifiers, used by Alembic.
revision: str = '0024'
down_revision: Union[str, Sequence[str], None] = '0023'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


@dataclass(frozen=True)
class Layout:
    """What a table is made of besides its columns: key, indexes, foreign keys."""

    primary_key: str
    indexes: tuple[str, ...]  # CREATE [UNIQUE] INDEX statements
    foreign_keys: tuple[str, ...]  # ADD CONSTRAINT clauses


PARTITIONED = {
    "events": ("received_at", Layout(
        "id, tenant_id, received_at",
        ('CREATE INDEX ix_events_run_id_time ON {t} (run_id, "time")',),
        ("fk_events_tenant_id_run_id_runs FOREIGN KEY (tenant_id, run_id) "
         "REFERENCES runs (tenant_id, id)",),
    )),
    "usage_lines": ("received_at", Layout(
        "id, tenant_id, received_at",
        ("CREATE INDEX ix_usage_lines_run_id ON {t} (run_id)",
         "CREATE UNIQUE INDEX uq_usage_lines_event_pk_tenant_id_received_at "
         "ON {t} (event_pk, tenant_id, received_at)"),
        ("fk_usage_lines_tenant_id_run_id_runs FOREIGN KEY (tenant_id, run_id) "
         "REFERENCES runs (tenant_id, id)",),
    )),
    "ledger_entries": ("created_at", Layout(
        "id, tenant_id, created_at",
        ("CREATE INDEX ix_ledger_entries_run_id ON {t} (run_id)",
         "CREATE INDEX ix_ledger_entries_tenant_id_customer_id ON {t} (tenant_id, customer_id)",
         "CREATE UNIQUE INDEX uq_ledger_entries_hold_usage_line ON {t} "
         "(usage_line_id, tenant_id, created_at) WHERE kind = 'hold'",
         "CREATE UNIQUE INDEX uq_ledger_entries_decision_posting ON {t} "
         "(run_id, decision_version, kind, corrects, tenant_id, created_at) "
         "NULLS NOT DISTINCT WHERE kind <> 'hold'"),
        ("fk_ledger_entries_tenant_id_customer_id_run_id_runs FOREIGN KEY "
         "(tenant_id, customer_id, run_id) REFERENCES runs (tenant_id, customer_id, id)",),
    )),
    "decisions": ("decided_at", Layout(
        "id, tenant_id, decided_at",
        ("CREATE INDEX ix_decisions_statement ON {t} "
         "(tenant_id, customer_id, statement_period, run_id, version)",
         "CREATE UNIQUE INDEX uq_decisions_run_id_version_tenant_id_decided_at ON {t} "
         "(run_id, version, tenant_id, decided_at)"),
        ("fk_decisions_tenant_id_run_id_runs FOREIGN KEY (tenant_id, run_id) "
         "REFERENCES runs (tenant_id, id)",),
    )),
    "stripe_deliveries": ("stripe_received_at", Layout(
        "id, tenant_id, stripe_received_at",
        ("CREATE INDEX ix_stripe_deliveries_run_id ON {t} (run_id)",
         "CREATE INDEX ix_stripe_deliveries_tenant_id_customer_id ON {t} (tenant_id, customer_id)",
         "CREATE UNIQUE INDEX uq_stripe_deliveries_kind_identifier_tenant_id_received ON {t} "
         "(kind, identifier, tenant_id, stripe_received_at)"),
        ("fk_stripe_deliveries_tenant_id_outbox_id_stripe_outbox FOREIGN KEY "
         "(tenant_id, outbox_id) REFERENCES stripe_outbox (tenant_id, id)",
         "fk_stripe_deliveries_tenant_id_run_id_runs FOREIGN KEY (tenant_id, run_id) "
         "REFERENCES runs (tenant_id, id)"),
    )),
}

# As they were (0021): one plain table each, for the downgrade.
PLAIN = {
    "events": Layout(
        "id, tenant_id",
        ('CREATE INDEX ix_events_run_id_time ON {t} (run_id, "time")',
         "ALTER TABLE {t} ADD CONSTRAINT uq_events_tenant_id_source_event_id "
         "UNIQUE (tenant_id, source, event_id)"),
        PARTITIONED["events"][1].foreign_keys,
    ),
    "usage_lines": Layout(
        "id, tenant_id",
        ("CREATE INDEX ix_usage_lines_run_id ON {t} (run_id)",
         "ALTER TABLE {t} ADD CONSTRAINT uq_usage_lines_event_pk_tenant_id "
         "UNIQUE (event_pk, tenant_id)"),
        PARTITIONED["usage_lines"][1].foreign_keys
        + ("fk_usage_lines_tenant_id_event_pk_events FOREIGN KEY (tenant_id, event_pk) "
           "REFERENCES events (tenant_id, id)",),
    ),
    "ledger_entries": Layout(
        "id, tenant_id",
        ("CREATE INDEX ix_ledger_entries_run_id ON {t} (run_id)",
         "CREATE INDEX ix_ledger_entries_tenant_id_customer_id ON {t} (tenant_id, customer_id)",
         "CREATE UNIQUE INDEX uq_ledger_entries_hold_usage_line ON {t} "
         "(usage_line_id, tenant_id) WHERE kind = 'hold'",
         "CREATE UNIQUE INDEX uq_ledger_entries_decision_posting ON {t} "
         "(run_id, decision_version, kind, corrects, tenant_id) "
         "NULLS NOT DISTINCT WHERE kind <> 'hold'"),
        PARTITIONED["ledger_entries"][1].foreign_keys
        + ("fk_ledger_entries_tenant_id_usage_line_id_usage_lines FOREIGN KEY "
           "(tenant_id, usage_line_id) REFERENCES usage_lines (tenant_id, id)",),
    ),
    "decisions": Layout(
        "id, tenant_id",
        ("CREATE INDEX ix_decisions_statement ON {t} "
         "(tenant_id, customer_id, statement_period, run_id, version)",
         "ALTER TABLE {t} ADD CONSTRAINT uq_decisions_run_id_version_tenant_id "
         "UNIQUE (run_id, version, tenant_id)"),
        PARTITIONED["decisions"][1].foreign_keys,
    ),
    "stripe_deliveries": Layout(
        "id, tenant_id",
        ("CREATE INDEX ix_stripe_deliveries_run_id ON {t} (run_id)",
         "CREATE INDEX ix_stripe_deliveries_tenant_id_customer_id ON {t} (tenant_id, customer_id)",
         "ALTER TABLE {t} ADD CONSTRAINT uq_stripe_deliveries_kind_identifier_tenant_id "
         "UNIQUE (kind, identifier, tenant_id)"),
        PARTITIONED["stripe_deliveries"][1].foreign_keys,
    ),
}

# Children before parents when dropping, parents before children when creating.
ORDER = ("events", "usage_lines", "ledger_entries", "decisions", "stripe_deliveries")


def _set_aside(table: str) -> str:
    """Rename ``table`` and everything named after it out of the way; returns its new name."""
    old = f"{table}_before_0024"
    op.execute(f"ALTER TABLE {table} RENAME TO {old}")
    rows = op.get_bind().exec_driver_sql(
        "SELECT conname FROM pg_constraint WHERE conrelid = %(t)s::regclass AND contype IN ('p', 'u', 'f')",
        {"t": old},
    ).fetchall()
    for (name,) in rows:
        op.execute(f"ALTER TABLE {old} DROP CONSTRAINT {name}")
    indexes = op.get_bind().exec_driver_sql(
        "SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = %(t)s::regclass",
        {"t": old},
    ).fetchall()
    for (name,) in indexes:
        op.execute(f"DROP INDEX {name}")
    op.execute(f"DROP TRIGGER {table}_append_only ON {old}")
    return old


def _build(table: str, layout: Layout, old: str, partition_by: str | None) -> None:
    suffix = f" PARTITION BY RANGE ({partition_by})" if partition_by else ""
    op.execute(
        f"CREATE TABLE {table} (LIKE {old} INCLUDING DEFAULTS INCLUDING CONSTRAINTS){suffix}"
    )
    op.execute(f"ALTER TABLE {table} ADD CONSTRAINT pk_{table} PRIMARY KEY ({layout.primary_key})")
    for statement in layout.indexes:
        op.execute(statement.format(t=table))
    if partition_by:
        op.execute(f"CREATE TABLE {table}_default PARTITION OF {table} DEFAULT")
        op.execute(
            f"SELECT fairmeter_ensure_month_partitions('{table}', "
            f"(LEAST(COALESCE((SELECT min({partition_by}) FROM {old}), now()), now()) "
            "AT TIME ZONE 'UTC')::date, ((now() + interval '3 months') AT TIME ZONE 'UTC')::date)"
        )


def _finish(table: str, layout: Layout, old: str) -> None:
    op.execute(f"ALTER SEQUENCE {table}_id_seq OWNED BY {table}.id")
    op.execute(f"DROP TABLE {old}")
    for clause in layout.foreign_keys:
        op.execute(f"ALTER TABLE {table} ADD CONSTRAINT {clause}")
    op.execute(
        f"CREATE TRIGGER {table}_append_only BEFORE DELETE OR UPDATE ON {table} "
        "FOR EACH ROW EXECUTE FUNCTION fairmeter_refuse_edit()"
    )


ENSURE = "fairmeter_ensure_month_partitions(regclass, date, date)"


def upgrade() -> None:
    """Upgrade schema."""
    op.execute(f"ALTER FUNCTION {ENSURE} SECURITY DEFINER SET search_path = public, pg_temp")
    for table in ORDER:
        op.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
    old = {table: _set_aside(table) for table in reversed(ORDER)}
    op.execute(f"ALTER TABLE {old['usage_lines']} ADD COLUMN received_at timestamptz")
    op.execute(
        f"UPDATE {old['usage_lines']} u SET received_at = e.received_at FROM {old['events']} e "
        "WHERE e.id = u.event_pk AND e.tenant_id = u.tenant_id"
    )
    op.execute(f"ALTER TABLE {old['usage_lines']} ALTER COLUMN received_at SET NOT NULL")
    for table in ORDER:
        column, layout = PARTITIONED[table]
        _build(table, layout, old[table], column)
        op.execute(f"INSERT INTO {table} SELECT * FROM {old[table]}")

    op.execute(
        "CREATE TABLE event_keys ("
        " tenant_id varchar(64) NOT NULL, source varchar(255) NOT NULL,"
        " event_id varchar(255) NOT NULL, body_hash bytea NOT NULL, event_pk bigint NOT NULL,"
        " received_at timestamptz NOT NULL,"
        " CONSTRAINT pk_event_keys PRIMARY KEY (tenant_id, source, event_id))"
    )
    op.execute(
        "INSERT INTO event_keys SELECT tenant_id, source, event_id, body_hash, id, received_at "
        "FROM events"
    )
    op.execute(
        "CREATE TABLE stripe_delivery_keys ("
        " tenant_id varchar(64) NOT NULL, kind varchar(20) NOT NULL,"
        " identifier varchar(120) NOT NULL,"
        " CONSTRAINT pk_stripe_delivery_keys PRIMARY KEY (tenant_id, kind, identifier))"
    )
    op.execute(
        "INSERT INTO stripe_delivery_keys SELECT tenant_id, kind, identifier FROM stripe_deliveries"
    )
    for table in ("event_keys", "stripe_delivery_keys"):
        op.execute(
            f"CREATE TRIGGER {table}_append_only BEFORE DELETE OR UPDATE ON {table} "
            "FOR EACH ROW EXECUTE FUNCTION fairmeter_refuse_edit()"
        )
    for table in ORDER:
        _finish(table, PARTITIONED[table][1], old[table])


def downgrade() -> None:
    """Downgrade schema: plain tables again, every row kept (events archived meanwhile are
    not brought back: restore them first)."""
    op.execute(f"ALTER FUNCTION {ENSURE} SECURITY INVOKER RESET search_path")
    op.execute("DROP TABLE stripe_delivery_keys")
    op.execute("DROP TABLE event_keys")
    for table in ORDER:
        op.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
    old = {table: _set_aside(table) for table in reversed(ORDER)}
    for table in ORDER:
        _build(table, PLAIN[table], old[table], None)
        if table == "usage_lines":
            op.execute("ALTER TABLE usage_lines DROP COLUMN received_at")
            columns = op.get_bind().exec_driver_sql(
                "SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) FROM pg_attribute "
                "WHERE attrelid = 'usage_lines'::regclass AND attnum > 0 AND NOT attisdropped"
            ).scalar()
            op.execute(f"INSERT INTO usage_lines SELECT {columns} FROM {old[table]}")
        else:
            op.execute(f"INSERT INTO {table} SELECT * FROM {old[table]}")
    for table in ORDER:
        op.execute(f"ALTER SEQUENCE {table}_id_seq OWNED BY {table}.id")
    for table in reversed(ORDER):
        op.execute(f"DROP TABLE {old[table]}")  # and its partitions
    for table in ORDER:
        layout = PLAIN[table]
        for clause in layout.foreign_keys:
            op.execute(f"ALTER TABLE {table} ADD CONSTRAINT {clause}")
        op.execute(
            f"CREATE TRIGGER {table}_append_only BEFORE DELETE OR UPDATE ON {table} "
            "FOR EACH ROW EXECUTE FUNCTION fairmeter_refuse_edit()"
        )
