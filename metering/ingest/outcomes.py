"""What a request's events came to: each event's outcome, and the request's counts.

An event is accepted (stored now), a duplicate (stored before, or earlier in the request:
the same id and content, so the same charge) or refused (an OTLP span's usage that its run
takes through the other protocol: ``metering.ingest.protocol``). A CloudEvents request never
has a refused event: it is refused whole instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from metering.errors import conflict
from metering.ingest.validation import ValidEvent

EventKey = tuple[str, str]  # (source, id)


@dataclass(frozen=True, slots=True)
class EventOutcome:
    source: str
    id: str
    result: str  # "accepted" | "duplicate" | "refused" (an OTLP span's usage: ``reason``)
    reason: str = ""


@dataclass(frozen=True, slots=True)
class IngestResult:
    accepted: int
    duplicates: int
    events: list[EventOutcome]


def outcome(
    event: ValidEvent,
    inserted: dict[EventKey, int],
    in_request_duplicates: set[int],
    refused: dict[EventKey, str],
) -> EventOutcome:
    """One event's outcome: refused, else accepted if this request stored it first."""
    key = (event.source, event.id)
    if key in refused:
        return EventOutcome(event.source, event.id, "refused", refused[key])
    is_new = key in inserted and event.index not in in_request_duplicates
    return EventOutcome(event.source, event.id, "accepted" if is_new else "duplicate")


def result_of(outcomes: list[EventOutcome]) -> IngestResult:
    """The counts of ``outcomes``, with them."""
    accepted = sum(1 for o in outcomes if o.result == "accepted")
    duplicates = sum(1 for o in outcomes if o.result == "duplicate")
    return IngestResult(accepted=accepted, duplicates=duplicates, events=outcomes)


def dedupe_within_request(
    events: Sequence[ValidEvent], *, single: bool
) -> tuple[list[ValidEvent], set[int]]:
    """Each key once (its first copy), and the indexes of the repeats, which are duplicates
    of it; a repeat with other content is a 409 ``event_conflict`` for the request."""
    first: dict[EventKey, ValidEvent] = {}
    repeats: set[int] = set()
    clashes: list[str] = []
    for event in events:
        key = (event.source, event.id)
        seen = first.setdefault(key, event)
        if seen is not event:
            if seen.body_hash != event.body_hash:
                clashes.append(f"{event.source}/{event.id}")
            repeats.add(event.index)
    if clashes:
        raise conflict(
            "the same event id was sent twice in this request with different content",
            code="event_conflict",
            conflicting_ids=clashes,
        )
    return list(first.values()), repeats
