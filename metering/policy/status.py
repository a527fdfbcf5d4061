"""Pure: the status words a user sees for a run (docs/policy.md).

Unsettled runs are read off their events in time order; settled runs off their decision.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Final

from metering.policy.facts import EventFact

AGENT_RUNNING: Final = "Agent still running"
CONNECTION_INTERRUPTED: Final = "Connection interrupted"
RECONNECTING: Final = "Reconnecting"
RESUMING: Final = "Resuming from checkpoint"
# Not in docs/policy.md's table: a run whose terminal event is in but whose settlement grace has
# not passed yet. Showing "Completed" or "Run failed — usage restored" before the policy has
# decided would promise an outcome we might not give.
SETTLING: Final = "Finished — settling usage"
COMPLETED: Final = "Completed"
COMPLETED_CREDITED: Final = "Completed — duplicate work credited"
# A completed run support credited (rule S1): not the policy's words for duplicate work,
# which would tell the customer the run repeated itself when it did not (issue #31 item 2).
COMPLETED_SUPPORT_CREDITED: Final = "Completed — credited by support"
CANCELLED: Final = "Cancelled"
FAILED_RESTORED: Final = "Run failed — usage restored"
FAILED_PARTIAL: Final = "Run failed — partially credited"
FAILED_CHARGED: Final = "Run failed — charged"
UNDER_REVIEW: Final = "Under review"
# Not in docs/policy.md's table either: a settled run that events arrived for afterwards. What the
# decision billed or credited stands, but the late usage is only held until the run settles
# again, so "Under review" or the old outcome's words would claim a decision nobody made.
RESETTLING: Final = "Late events arrived — settling again"

# Evaluation order for events with the same timestamp: the run's own lifecycle first.
_TYPE_ORDER = {
    "run.started": 0,
    "connection.lost": 1,
    "connection.restored": 2,
    "run.resumed": 3,
}
# The event types besides usage that ``live_status`` reads: an event of another type (a
# terminal one aside) never changes an unsettled run's words, and usage only ends
# RESUMING. Ingest recomputes the words only when one of these can apply.
LIVE_STATUS_TYPES: Final = frozenset({"connection.lost", "connection.restored", "run.resumed"})


def run_status(
    *, parked: bool, reopened: bool, decided: str | None, live: Callable[[], str]
) -> str:
    """The words a user sees for a run, whoever asks (the run page, ingest and settlement
    announcing a change): a parked run is under review; a settled run that events reached
    since is settling again; else its decision's words, or, before any decision, the words
    its events give (``live``, called only then: it reads every event of the run)."""
    if parked:
        return UNDER_REVIEW
    if reopened:
        return RESETTLING
    if decided is not None:
        return decided
    return live()


def live_status(events: Iterable[EventFact], *, terminal: bool) -> str:
    """The status of a run that has not been settled yet."""
    if terminal:
        return SETTLING
    server_lost = client_lost = False
    resuming_attempt: int | None = None
    for event in sorted(events, key=lambda e: (e.time, _TYPE_ORDER.get(e.type, 9), e.event_id)):
        side = event.data.get("side")
        if event.type == "connection.lost":
            server_lost |= side == "server"
            client_lost |= side == "client"
        elif event.type == "connection.restored":
            server_lost &= side != "server"
            client_lost &= side != "client"
        elif event.type == "run.resumed":
            server_lost = client_lost = False
            resuming_attempt = int(event.data["attempt"])
        elif (
            event.type == "run.usage"
            and resuming_attempt is not None
            and int(event.data.get("attempt", 1)) >= resuming_attempt
        ):
            resuming_attempt = None
    if resuming_attempt is not None:
        return RESUMING
    if server_lost:
        return CONNECTION_INTERRUPTED
    if client_lost:
        return RECONNECTING
    return AGENT_RUNNING
