"""Claiming outbox rows: whose rows a claim takes, and that its cost ignores the backlog."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from metering.billing import claims
from metering.billing.claims import CLAIM, CLAIM_SCAN_FACTOR, claim, release
from metering.billing.outbox import OutboxRow, enqueue

NOW = datetime.now(UTC).replace(microsecond=0)
LEASE = timedelta(minutes=2)


def seed(db: Any, *, rows: int, customers: int, start: int = 0, one_instant: bool = False) -> None:
    """Pending outbox rows of settled runs, customer ``c<n % customers>``, due in id order
    (or all due at one instant, as the rows one settlement transaction writes)."""
    db.execute("INSERT INTO tenants (id) VALUES ('acme') ON CONFLICT DO NOTHING")
    db.execute(
        "INSERT INTO customers (tenant_id, id, stripe_customer_id) "
        "SELECT 'acme', 'c' || g, 'cus_' || g FROM generate_series(0, %s - 1) g "
        "ON CONFLICT DO NOTHING",
        (customers,),
    )
    db.execute(
        """
        WITH new_runs AS (
            INSERT INTO runs (tenant_id, subject, customer_id, first_event_at, last_event_at,
                              last_received_at, event_count, gross_micros, billed_micros)
            SELECT 'acme', 'run-' || g, 'c' || (g %% %(customers)s), %(t)s, %(t)s, %(t)s, 1,
                   1000, 1000
            FROM generate_series(%(start)s, %(end)s - 1) g
            RETURNING id, customer_id
        )
        INSERT INTO stripe_outbox (tenant_id, customer_id, run_id, decision_version,
            target_billed_micros, period, event_timestamp, status, next_attempt_at)
        SELECT 'acme', customer_id, id, 1, 1000, %(period)s, %(t)s, 'pending',
               %(t)s + CASE WHEN %(one_instant)s THEN interval '0' ELSE id * interval '1 ms' END
        FROM new_runs ORDER BY id
        """,
        {
            "customers": customers,
            "start": start,
            "end": start + rows,
            "t": NOW - timedelta(hours=1),
            "period": NOW.strftime("%Y-%m"),
            "one_instant": one_instant,
        },
    )
    db.execute("ANALYZE stripe_outbox")


def test_a_claim_skips_leased_customers_and_takes_the_longest_waiting_in_id_order(db):
    seed(db, rows=12, customers=3)  # run n belongs to customer c(n % 3)
    first = claim(db, NOW, limit=100, lease=LEASE, max_customers=1, holder="one")
    assert {i.customer_id for i in first} == {"c0"}  # its row is the oldest
    assert [i.id for i in first] == sorted(i.id for i in first) and len(first) == 4
    second = claim(db, NOW, limit=100, lease=LEASE, max_customers=1, holder="two")
    assert {i.customer_id for i in second} == {"c1"}  # c0 is leased: skipped
    later = claim(db, NOW + LEASE + timedelta(seconds=1), limit=100, lease=LEASE, holder="3")
    assert {i.customer_id for i in later} == {"c0", "c1", "c2"}  # the leases ran out


def leases(db: Any) -> dict[str, str]:
    return dict(db.execute("SELECT customer_id, holder FROM stripe_customer_leases").fetchall())


def correct(db: Any, customer: str) -> None:
    """Settlement re-decides every run of ``customer``: version 2 supersedes version 1."""
    rows = db.execute(
        "SELECT tenant_id, customer_id, run_id, 2, 500, period, event_timestamp "
        "FROM stripe_outbox WHERE customer_id = %s AND decision_version = 1",
        (customer,),
    ).fetchall()
    enqueue(db, [OutboxRow(*row) for row in rows], unit_micros=1)


def test_a_customer_being_sent_gets_nothing_claimed_though_its_rows_were_superseded(db):
    seed(db, rows=6, customers=2)
    # The test's own now, not the module's: under load the module's NOW can be older than a
    # lease by the time this runs, and the sending pusher's lease would have lapsed.
    now = datetime.now(UTC)
    first = claim(db, now, limit=100, lease=LEASE, max_customers=1, holder="sending")
    assert {i.customer_id for i in first} == {"c0"} and leases(db) == {"c0": "sending"}
    correct(db, "c0")  # its claimed rows superseded, new pending rows due at once
    db.execute("UPDATE stripe_outbox SET status = 'sent' WHERE id = %s", (first[0].id,))
    statuses = db.execute(
        "SELECT DISTINCT status FROM stripe_outbox WHERE customer_id = 'c0' AND id = ANY(%s)",
        ([i.id for i in first],),
    ).fetchall()
    assert {s for (s,) in statuses} == {"sent", "superseded"}

    second = claim(db, datetime.now(UTC), limit=100, lease=LEASE, holder="racing")
    assert {i.customer_id for i in second} == {"c1"}  # c0's lease is in force: none of its rows
    assert leases(db) == {"c0": "sending", "c1": "racing"}


def test_a_lapsed_lease_is_taken_over_and_the_old_holders_release_leaves_it(db):
    seed(db, rows=4, customers=1)
    claim(db, NOW, limit=100, lease=LEASE, holder="killed")
    correct(db, "c0")
    later = datetime.now(UTC) + LEASE + timedelta(seconds=1)  # the killed pusher's lease lapsed
    taken = claim(db, later, limit=100, lease=LEASE, holder="next")
    assert len(taken) == 4 and {i.version for i in taken} == {2}
    # The old holder's stalled heartbeat renews at last: it learns the customer is lost.
    until = later + LEASE
    assert claims.renew(db, "killed", [], until, {("acme", "c0")}) == {("acme", "c0")}
    assert claims.renew(db, "next", [], until, {("acme", "c0")}) == set()
    release(db, "killed", "acme", "c0")  # the killed pusher, back too late
    assert leases(db) == {"c0": "next"}
    assert claim(db, later, limit=100, lease=LEASE, holder="third") == []
    release(db, "next", "acme", "c0")
    assert leases(db) == {}


def rows_examined(node: dict[str, Any], table: str = "stripe_outbox") -> int:
    """Rows of ``table`` the plan's scans returned or filtered out, over the whole tree."""
    own = 0
    if node.get("Relation Name") == table:
        own = int(node["Actual Rows"]) * int(node["Actual Loops"])
        own += int(node.get("Rows Removed by Filter", 0)) * int(node["Actual Loops"])
    return own + sum(rows_examined(child, table) for child in node.get("Plans", []))


def test_a_claim_examines_about_as_many_rows_with_a_large_backlog_as_with_a_small_one(db):
    def examined_by_a_claim() -> int:
        params = {
            "now": NOW,
            "limit": 200,
            "scan": CLAIM_SCAN_FACTOR * 200,
            "until": NOW + LEASE,
            "holder": "explained",
            "customers": 16,
        }
        db.execute("BEGIN")
        try:
            explain = "EXPLAIN (ANALYZE, FORMAT JSON) " + CLAIM
            (plan,) = db.execute(explain, params).fetchone()
        finally:
            db.execute("ROLLBACK")
        return rows_examined((plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"])

    # All due at one instant: the worst case, where only the index's id order bounds the read.
    seed(db, rows=3_000, customers=64, one_instant=True)
    small = examined_by_a_claim()
    seed(db, rows=57_000, customers=64, start=3_000, one_instant=True)  # twenty times larger
    large = examined_by_a_claim()
    assert large < 2 * small, (small, large)  # not proportional to the backlog
