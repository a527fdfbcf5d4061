"""The status words last announced for each run (``runs.announced_status``).

Every change point that announces ``run.status_changed`` (ingest, settlement, parking)
writes the new words here in the same transaction, under the run's lock: the next change
is compared with them, so the same change is never announced twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from metering.notifications.record import Notification, record_many

REMEMBER = """
UPDATE runs SET announced_status = a.status
FROM unnest(%(ids)s::bigint[], %(statuses)s::text[]) AS a(id, status)
WHERE runs.id = a.id
"""


def remember(conn: psycopg.Connection[Any], announced: Sequence[tuple[int, str]]) -> None:
    """Store (run id, words) pairs as the runs' announced words."""
    if announced:
        conn.execute(
            REMEMBER,
            {"ids": [run_id for run_id, _ in announced], "statuses": [w for _, w in announced]},
        )


def remember_and_record(
    conn: psycopg.Connection[Any],
    announced: Sequence[tuple[int, str]],
    notifications: Sequence[Notification],
) -> None:
    """``remember`` the words and ``record_many`` the notifications, in one round trip."""
    if not announced:
        record_many(conn, notifications)  # one statement: nothing to pipeline
        return
    with conn.pipeline():
        remember(conn, announced)
        record_many(conn, notifications)
