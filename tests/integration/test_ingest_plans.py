"""Ingest's statement probes keys, whatever the statistics say (bench/ingest.py found it).

Its plan is generic and kept for the connection. Made while ``event_keys`` was analysed
empty (a new database), the duplicate probe was a sequential scan of every stored key, for
each event of each later batch, until the next ANALYZE: one batch took 22 s after 60,000
events.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from metering.ingest.store import GENERIC_PLANS, INSERT_EVENTS


def nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from nodes(child)


def test_the_generic_plan_probes_event_keys_by_key_after_an_analyze_of_an_empty_table(
    db, database_url
):
    import psycopg

    with psycopg.connect(database_url) as conn:
        conn.execute("ANALYZE event_keys")  # empty, as in a database just made
        conn.execute(GENERIC_PLANS)
        sql = (
            INSERT_EVENTS.replace("%(events)s", "$1")
            .replace("%(tenant)s", "$2")
            .replace("%(now)s", "$3")
        )
        conn.execute(f"PREPARE ingest_probe (text, text, timestamptz) AS {sql}")
        (plan,) = conn.execute(
            "EXPLAIN (FORMAT JSON) EXECUTE ingest_probe('[]', 'acme', now())"
        ).fetchone()
        conn.rollback()
    root = (plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"]
    reads = [
        (n["Node Type"], n.get("Index Name"))
        for n in nodes(root)
        if n.get("Relation Name") == "event_keys" and n["Node Type"] != "ModifyTable"
    ]
    assert reads, reads
    assert all(kind != "Seq Scan" for kind, _ in reads), reads
