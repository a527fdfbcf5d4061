"""A webhook claim stays cheap however long one endpoint's backlog (issue #18's capacity
bench found each claim reading the endpoint's whole pending queue once per message).

A message is claimable when it is the head of its (endpoint, run) line: no earlier pending
message of the same run. That test must be a probe of the line's index, not a walk of the
endpoint's queue: with a backlog of thousands, a claim of 64 read some 27,000 buffers, and
draining a backlog cost PostgreSQL time quadratic in its length.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from metering.db import raw_transaction
from metering.webhooks.breaker import HALF_OPEN_AFTER
from metering.webhooks.delivery import CLAIM
from tests.helpers.webhooks import add_endpoint

BACKLOG = 4_000
DELIVERED = 20_000  # history: messages delivered long ago, still stored
CLAIMED = 64


def backlog(db: Any, endpoint_id: str, now: datetime) -> None:
    """BACKLOG pending messages at one endpoint, each of its own run (each claimable), and
    DELIVERED more delivered a month ago."""
    db.execute(
        "INSERT INTO notifications (tenant_id, customer_id, type, data) "
        "SELECT 'acme', 'cust-1', 'run.settled', '{}'::jsonb FROM generate_series(1, %s)",
        (BACKLOG,),
    )
    db.execute(
        "INSERT INTO webhook_messages (msg_id, tenant_id, endpoint_id, notification_id, run_id, "
        "type, payload, status, next_attempt_at) "
        "SELECT 'msg_' || n.id, 'acme', %s, n.id, n.id, 'run.settled', '{}', 'pending', "
        "%s - make_interval(secs => n.id %% 600) FROM notifications n",
        (endpoint_id, now),
    )
    db.execute(
        "INSERT INTO notifications (tenant_id, customer_id, type, data) "
        "SELECT 'acme', 'cust-1', 'run.settled', '{}'::jsonb FROM generate_series(1, %s)",
        (DELIVERED,),
    )
    db.execute(
        "INSERT INTO webhook_messages (msg_id, tenant_id, endpoint_id, notification_id, run_id, "
        "type, payload, status, next_attempt_at, finished_at) "
        "SELECT 'msg_' || n.id, 'acme', %s, n.id, n.id, 'run.settled', '{}', 'delivered', "
        "%s - interval '30 days', %s - interval '30 days' FROM notifications n "
        "WHERE NOT EXISTS (SELECT 1 FROM webhook_messages w WHERE w.notification_id = n.id)",
        (endpoint_id, now, now),
    )
    db.execute("ANALYZE webhook_messages")


def nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan]
    for child in plan.get("Plans", []):
        found.extend(nodes(child))
    return found


def test_a_claim_probes_each_messages_run_line_instead_of_walking_the_backlog(engine, settings, db):
    endpoint_id, _ = add_endpoint(engine, settings, "http://127.0.0.1:9/hooks")
    now = datetime.now(UTC)
    backlog(db, endpoint_id, now)
    params = {
        "now": now,
        "limit": CLAIMED,
        "until": now + timedelta(seconds=30),
        "per_endpoint": 1_000_000,
        "half_open_after": HALF_OPEN_AFTER,
        "probes": True,
    }
    with raw_transaction(engine) as conn:
        ((explained,),) = conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + CLAIM, params
        ).fetchall()
        conn.rollback()  # EXPLAIN ANALYZE ran the claim: it is not kept
    plan = (explained if isinstance(explained, list) else json.loads(explained))[0]["Plan"]
    earlier = [
        n
        for n in nodes(plan)
        if n.get("Relation Name") == "webhook_messages" and n.get("Alias") == "p"
    ]
    assert earlier, "no lookup of the run's earlier messages in the plan"
    assert {n.get("Index Name") for n in earlier} == {"ix_webhook_messages_line"}, earlier
    scans = [n for n in nodes(plan) if n.get("Relation Name") == "webhook_messages"]
    assert all(n["Node Type"] != "Seq Scan" for n in scans), "a claim read every message"
    # Picking the 64 costs a few pages each, not a walk of the 4,000 pending (12,000 pages
    # before); updating them costs what updating 64 rows costs, whatever the backlog.
    [picked] = [n for n in nodes(plan) if n.get("Alias") == "picked"]
    buffers = picked["Shared Hit Blocks"] + picked["Shared Read Blocks"]
    assert buffers < 10 * CLAIMED, f"{buffers} buffers to pick a claim of {CLAIMED}"
