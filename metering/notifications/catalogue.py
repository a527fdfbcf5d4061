"""The notification types a tenant can subscribe to, each defined here once.

A webhook endpoint's filter and the API's validation read ``EVENT_TYPES``; docs/events.md
("Notifications") describes each type's own fields, when it is recorded and in which order
per run. ``metering.notifications.builders`` adds the fields every payload carries.
"""

from __future__ import annotations

from typing import Final

# Bumped when a payload changes incompatibly; sent in every payload.
SCHEMA_VERSION: Final = "2026-12-01"

# The PostgreSQL channel ``record`` notifies on commit; the stream listens on it.
CHANNEL: Final = "fairmeter_notifications"

RUN_STATUS_CHANGED: Final = "run.status_changed"
RUN_SETTLED: Final = "run.settled"
RUN_RESETTLED: Final = "run.resettled"
RUN_HELD: Final = "run.held"
RUN_RELEASED: Final = "run.released"
CREDIT_GRANTED: Final = "credit.granted"
DISPUTE_OPENED: Final = "dispute.opened"
DISPUTE_RESOLVED: Final = "dispute.resolved"
STATEMENT_CLOSED: Final = "statement.closed"

EVENT_TYPES: Final = {
    RUN_STATUS_CHANGED: "a run's status words changed (ingest or settlement)",
    RUN_SETTLED: "a run's first decision",
    RUN_RESETTLED: "a new decision version for a run, with what changed",
    RUN_HELD: "a run was held for review",
    RUN_RELEASED: "support released a held run",
    CREDIT_GRANTED: "support credited a run",
    DISPUTE_OPENED: "a dispute was opened on a run",
    DISPUTE_RESOLVED: "a dispute was approved or rejected",
    STATEMENT_CLOSED: "a customer's statement period closed",
}
