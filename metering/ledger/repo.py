"""Storage of ledger entries: the one place rows enter ``ledger_entries``.

Like a transfer in TigerBeetle or Formance, a posting is written in one place only, so its
shape (which columns, which kinds, what a correction names) is defined once. Ingest writes
**holds** inside its one-statement insert (``HOLDS_FROM_USAGE_LINES``: a fragment of that
statement, kept here); settlement writes **posts**, **releases** and **corrections** through
:func:`insert_entries`. The table itself refuses UPDATE and DELETE.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgspec
import psycopg

from metering.ledger.postings import Position, postings_between

# A CTE body for ingest's statement: one hold per usage line just inserted (CTE ``lines``
# with ``id, run_id, gross_micros``), on the run's customer account.
HOLDS_FROM_USAGE_LINES: Final = """
    INSERT INTO ledger_entries (tenant_id, customer_id, run_id, kind, amount_micros,
                                usage_line_id)
    SELECT %(tenant)s::text, r.customer_id, l.run_id, 'hold', l.gross_micros, l.id
    FROM lines l JOIN runs r ON r.id = l.run_id
"""


@dataclass(frozen=True, slots=True)
class RunAccount:
    """Whose money a run's entries move."""

    tenant_id: str
    customer_id: str
    run_id: int


@dataclass(frozen=True, slots=True)
class EntryRecord:
    tenant_id: str
    customer_id: str
    run_id: int
    kind: str
    amount_micros: int
    decision_version: int
    corrects: str | None


def entries_moving(
    account: RunAccount, current: Position, target: Position, *, decision_version: int
) -> list[EntryRecord]:
    """The rows that take a run from ``current`` to ``target`` under a decision version."""
    return [
        EntryRecord(
            tenant_id=account.tenant_id,
            customer_id=account.customer_id,
            run_id=account.run_id,
            kind=posting.kind,
            amount_micros=posting.amount_micros,
            decision_version=decision_version,
            corrects=posting.corrects,
        )
        for posting in postings_between(current, target)
    ]


def insert_entries(conn: psycopg.Connection[Any], entries: Sequence[EntryRecord]) -> None:
    """Append ``entries`` in the caller's transaction (one statement for any number)."""
    if not entries:
        return
    conn.execute(
        """
        INSERT INTO ledger_entries (tenant_id, customer_id, run_id, kind, amount_micros,
                                    decision_version, corrects)
        SELECT tenant_id, customer_id, run_id, kind, amount_micros, decision_version, corrects
        FROM json_to_recordset(%(entries)s::json)
             AS e(tenant_id text, customer_id text, run_id bigint, kind text,
                  amount_micros bigint, decision_version int, corrects text)
        """,
        # One JSON text parameter, not an array per column: msgspec encodes it in C.
        {"entries": msgspec.json.encode(entries).decode()},
    )
