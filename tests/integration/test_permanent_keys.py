"""The keys that must hold forever hold after their month's partition is gone (issue #18).

Events and Stripe deliveries are partitioned by month (migration 0024), and a month of raw
events is archived and dropped after 13 months; a partitioned table can only enforce a key
that includes the month. So the idempotency key of an event and the key of a Stripe
delivery live in tables of their own. These tests drop the month's partition, as the
archive does, and send the same thing again in a later month: nothing is counted twice.

Each test works in one transaction it rolls back (DDL is transactional in PostgreSQL), so
the shared test database keeps its partitions.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from metering.billing.outbox import Delivery, OutboxItem, record_deliveries
from metering.billing.plan import Step
from metering.config import Settings
from metering.errors import MeteringError
from metering.history.partitions import month_start
from metering.ingest.service import IngestRequest, ingest_events
from metering.keys_repo import ensure_tenant
from metering.prices import CatalogCache, load_catalog
from tests.helpers.events import usage

NOW = datetime.now(UTC)
# A month long past (the test prices start in January 2026): its partitions are made by the
# test, then dropped as the archive would.
OLD = datetime(2026, 2, 10, 12, tzinfo=UTC)


@pytest.fixture
def conn(db: psycopg.Connection[Any], database_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A transaction on an empty database, rolled back at the end."""
    with psycopg.connect(database_url) as connection:
        yield connection
        connection.rollback()


def make_month(conn: psycopg.Connection[Any], table: str, moment: datetime) -> str:
    first = month_start(moment)
    (name, outcome) = conn.execute(
        "SELECT * FROM fairmeter_ensure_month_partitions(%s, %s, %s)", (table, first, first)
    ).fetchone()
    assert outcome == "created", (name, outcome)
    return str(name)


def drop_month(conn: psycopg.Connection[Any], table: str, partition: str) -> None:
    conn.execute(f"ALTER TABLE {table} DETACH PARTITION {partition}")
    conn.execute(f"DROP TABLE {partition}")


def send(
    conn: psycopg.Connection[Any], settings: Settings, events: list[dict[str, Any]], at: datetime
) -> Any:
    catalog = load_catalog(conn)
    request = IngestRequest("acme", events, single=False, received_at=at)
    return ingest_events(conn, request, settings, CatalogCache(lambda: catalog))


def test_an_event_stays_a_duplicate_after_its_month_of_raw_events_is_dropped(conn, settings):
    # Old events are accepted in this test (the default refuses what is 35 days old).
    lenient = settings.model_copy(update={"max_event_age_s": 3 * 365 * 24 * 3600})
    ensure_tenant(conn, "acme")
    events_month = make_month(conn, "events", OLD)
    make_month(conn, "usage_lines", OLD)
    original = usage(id="evt-old-1", run="run-old", time=OLD - timedelta(minutes=1))
    first = send(conn, lenient, [original], OLD)
    assert [e.result for e in first.events] == ["accepted"]
    gross = conn.execute("SELECT gross_micros FROM runs WHERE subject = 'run-old'").fetchone()

    drop_month(conn, "events", events_month)  # archived: the raw event is gone
    assert conn.execute("SELECT count(*) FROM events").fetchone() == (0,)

    again = send(conn, lenient, [original], NOW)
    assert [e.result for e in again.events] == ["duplicate"]
    assert conn.execute("SELECT count(*) FROM events").fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM usage_lines").fetchone() == (1,)
    assert conn.execute("SELECT count(*) FROM ledger_entries WHERE kind = 'hold'").fetchone() == (
        1,
    )
    assert (
        conn.execute("SELECT gross_micros FROM runs WHERE subject = 'run-old'").fetchone() == gross
    )

    changed = {**original, "data": {**original["data"], "output_tokens": 9}}
    conn.execute("SAVEPOINT changed")
    with pytest.raises(MeteringError) as refused:
        send(conn, lenient, [changed], NOW)
    assert refused.value.status == 409
    conn.execute("ROLLBACK TO SAVEPOINT changed")


def test_a_new_event_id_in_a_later_month_is_stored(conn, settings):
    ensure_tenant(conn, "acme")
    send(conn, settings, [usage(id="evt-a", run="run-a")], datetime.now(UTC))
    stored = send(conn, settings, [usage(id="evt-b", run="run-a", step=2)], datetime.now(UTC))
    assert [e.result for e in stored.events] == ["accepted"]
    rows = conn.execute(
        "SELECT e.id, k.event_pk FROM events e JOIN event_keys k USING "
        "(tenant_id, source, event_id) ORDER BY e.id"
    ).fetchall()
    assert [r[0] for r in rows] == [r[1] for r in rows] and len(rows) == 2


def outbox_row(conn: psycopg.Connection[Any]) -> OutboxItem:
    ensure_tenant(conn, "acme")
    conn.execute("INSERT INTO customers (tenant_id, id) VALUES ('acme', 'cust-1')")
    (run_id,) = conn.execute(
        "INSERT INTO runs (tenant_id, subject, customer_id, first_event_at, last_event_at, "
        "last_received_at, event_count) VALUES ('acme', 'run-s', 'cust-1', now(), now(), "
        "now(), 1) RETURNING id"
    ).fetchone()
    (outbox_id,) = conn.execute(
        "INSERT INTO stripe_outbox (tenant_id, customer_id, run_id, decision_version, "
        "target_billed_micros, period, event_timestamp, status) VALUES ('acme', 'cust-1', %s, "
        "1, 5000000, %s, now(), 'pending') RETURNING id",
        (run_id, f"{NOW:%Y-%m}"),
    ).fetchone()
    return OutboxItem(
        id=outbox_id,
        tenant_id="acme",
        customer_id="cust-1",
        stripe_customer_id="cus_1",
        run_id=run_id,
        version=1,
        target_micros=5_000_000,
        period=f"{NOW:%Y-%m}",
        event_timestamp=NOW,
        plan=None,
        next_step=0,
        attempts=0,
    )


def test_a_stripe_delivery_is_recorded_once_though_recorded_again_in_another_month(conn):
    item = outbox_row(conn)
    step = Step(
        "meter_event", "fm-acme-run-s-1", 5_000_000, units=5_000_000, timestamp=int(NOW.timestamp())
    )
    earlier = NOW - timedelta(days=40)  # another month's partition (or the default one)
    record_deliveries(conn, [Delivery(item, 0, step, earlier, None, last=True)], earlier)
    # The same delivery recorded again a month later (a retry that found it had landed):
    record_deliveries(conn, [Delivery(item, 0, step, NOW, "again", last=True)], NOW)
    rows = conn.execute("SELECT identifier, stripe_received_at FROM stripe_deliveries").fetchall()
    assert rows == [("fm-acme-run-s-1", earlier)]
    assert conn.execute("SELECT count(*) FROM stripe_delivery_keys").fetchone() == (1,)
