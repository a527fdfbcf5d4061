"""the audit log is partitioned by month (issue #18), with the function that makes partitions

The append-only tables are to be range-partitioned by month, so a month's rows are one
table that can be archived and dropped whole, and a query over recent months reads only
their partitions. This revision starts with the audit log (no key but its primary key, no
foreign key points at it) and adds what every such table will use:

- ``fairmeter_ensure_month_partitions(parent, first, last)``: creates the monthly partition
  ``<parent>_yYYYYmMM`` of each month from ``first`` to ``last`` that is missing, and says
  for each month whether it was created, existed, or was blocked (its default partition
  holds rows of that month: creating it would fail, so it is left for an operator, and
  those rows are safe where they are). The beat task ``fairmeter.ensure_partitions`` calls
  it every hour for this month and the next ones (``metering/history/partitions.py``); this
  revision calls it for every month that has rows, and three ahead.
- a DEFAULT partition per table: a row of a month whose partition does not exist yet (the
  beat stopped for months) is stored, never refused.

A partitioned table's primary key must include its partition key: the audit log's becomes
``(id, tenant_id, created_at)``; ids still come from the same sequence. Rows are copied
into the partitioned table under an ACCESS EXCLUSIVE lock (the audit log is small next to
events; plan a window for a large one). The append-only trigger is made on the parent, and
PostgreSQL gives it to every partition.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-02 09:20:00

"""
from typing import Sequence, Union

from alembic import op


# revision identifiers, used by Alembic.
revision: str = '0023'
down_revision: Union[str, Sequence[str], None] = '0022'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

ENSURE_MONTH_PARTITIONS = r"""
CREATE OR REPLACE FUNCTION fairmeter_ensure_month_partitions(
    parent regclass, first_month date, last_month date
) RETURNS TABLE (partition_name text, outcome text)
LANGUAGE plpgsql AS $$
DECLARE
    month date := date_trunc('month', first_month::timestamp)::date;
    upper_bound date;
BEGIN
    WHILE month <= last_month LOOP
        upper_bound := (month + interval '1 month')::date;
        partition_name := format('%s_y%sm%s', parent::text, to_char(month, 'YYYY'),
                                 to_char(month, 'MM'));
        IF to_regclass(partition_name) IS NOT NULL THEN
            outcome := 'exists';
        ELSE
            BEGIN
                -- Bounds at midnight UTC, whatever the session's time zone.
                EXECUTE format(
                    'CREATE TABLE %I PARTITION OF %s FOR VALUES FROM (%L) TO (%L)',
                    partition_name, parent,
                    month::timestamp AT TIME ZONE 'UTC', upper_bound::timestamp AT TIME ZONE 'UTC');
                outcome := 'created';
            EXCEPTION WHEN check_violation THEN
                -- The default partition holds rows of this month.
                outcome := 'blocked';
            END;
        END IF;
        RETURN NEXT;
        month := upper_bound;
    END LOOP;
END;
$$;
"""


def upgrade() -> None:
    """Upgrade schema."""
    op.execute(ENSURE_MONTH_PARTITIONS)
    op.execute("LOCK TABLE audit_log IN ACCESS EXCLUSIVE MODE")
    op.execute("ALTER TABLE audit_log RENAME TO audit_log_unpartitioned")
    op.execute("ALTER TABLE audit_log_unpartitioned RENAME CONSTRAINT pk_audit_log TO pk_audit_log_unpartitioned")
    op.execute("ALTER INDEX ix_audit_log_tenant_id_created_at RENAME TO ix_audit_log_unpartitioned_tenant_created")
    op.execute(
        "CREATE TABLE audit_log (LIKE audit_log_unpartitioned INCLUDING DEFAULTS INCLUDING CONSTRAINTS) "
        "PARTITION BY RANGE (created_at)"
    )
    op.execute("ALTER TABLE audit_log ADD CONSTRAINT pk_audit_log PRIMARY KEY (id, tenant_id, created_at)")
    op.execute("CREATE INDEX ix_audit_log_tenant_id_created_at ON audit_log (tenant_id, created_at)")
    op.execute("CREATE TABLE audit_log_default PARTITION OF audit_log DEFAULT")
    op.execute(
        "SELECT fairmeter_ensure_month_partitions('audit_log', "
        "(LEAST(COALESCE((SELECT min(created_at) FROM audit_log_unpartitioned), now()), now()) "
        "AT TIME ZONE 'UTC')::date, ((now() + interval '3 months') AT TIME ZONE 'UTC')::date)"
    )
    op.execute("INSERT INTO audit_log SELECT * FROM audit_log_unpartitioned")
    op.execute("ALTER SEQUENCE audit_log_id_seq OWNED BY audit_log.id")
    op.execute("DROP TABLE audit_log_unpartitioned")
    op.execute(
        "CREATE TRIGGER audit_log_append_only BEFORE DELETE OR UPDATE ON audit_log "
        "FOR EACH ROW EXECUTE FUNCTION fairmeter_refuse_edit()"
    )


def downgrade() -> None:
    """Downgrade schema: one plain table again, every row kept."""
    op.execute("LOCK TABLE audit_log IN ACCESS EXCLUSIVE MODE")
    op.execute("ALTER TABLE audit_log RENAME TO audit_log_partitioned")
    op.execute("ALTER TABLE audit_log_partitioned RENAME CONSTRAINT pk_audit_log TO pk_audit_log_partitioned")
    op.execute("ALTER INDEX ix_audit_log_tenant_id_created_at RENAME TO ix_audit_log_partitioned_tenant_created")
    op.execute(
        "CREATE TABLE audit_log (LIKE audit_log_partitioned INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
    )
    op.execute("ALTER TABLE audit_log ADD CONSTRAINT pk_audit_log PRIMARY KEY (id, tenant_id)")
    op.execute("CREATE INDEX ix_audit_log_tenant_id_created_at ON audit_log (tenant_id, created_at)")
    op.execute("INSERT INTO audit_log SELECT * FROM audit_log_partitioned")
    op.execute("ALTER SEQUENCE audit_log_id_seq OWNED BY audit_log.id")
    op.execute("DROP TABLE audit_log_partitioned")  # and its partitions
    op.execute(
        "CREATE TRIGGER audit_log_append_only BEFORE DELETE OR UPDATE ON audit_log "
        "FOR EACH ROW EXECUTE FUNCTION fairmeter_refuse_edit()"
    )
    op.execute("DROP FUNCTION fairmeter_ensure_month_partitions(regclass, date, date)")
