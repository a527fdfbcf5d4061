"""One protocol per run's usage: the rule that keeps a model call from being charged twice.

Usage reaches Fairmeter two ways: CloudEvents (``POST /v1/events``, docs/events.md) and OTLP
spans (``POST /v1/traces``, docs/otlp.md). Their event ids differ by design (a backend's own
id against ``<trace>-<span>-usage``), so when a backend sends one model call both ways,
idempotency cannot see that the two are one call. Nothing in a usage event tells the two
apart either (two calls of one model with the same tokens are common), so the rule is the
run's: the protocol that brings a run's first usage is recorded on the run
(``runs.usage_protocol``) and usage through the other one is refused. Lifecycle events
(start, tool calls, connection telemetry, the end) are not charged and stay accepted through
either protocol.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from metering.catalogue import CLOUDEVENTS, OTLP, USAGE_TYPE
from metering.errors import FieldError, validation_error
from metering.ingest.validation import ValidEvent

CONFLICT_CODE: Final = "usage_protocol_conflict"

_ENDPOINTS: Final = {CLOUDEVENTS: "CloudEvents, POST /v1/events", OTLP: "OTLP, POST /v1/traces"}


def conflict_message(subject: str, recorded: str) -> str:
    """Why a usage event of run ``subject`` is refused, its usage having come through
    ``recorded``: the run, the rule and where it is explained, for a person or a log line."""
    return (
        f"run {subject}'s usage came through {_ENDPOINTS[recorded]} first: usage of one run "
        f"must come through one protocol, else one model call sent both ways is charged "
        f"twice ({CONFLICT_CODE}; docs/otlp.md, 'One path per run')"
    )


def first_usage_protocol(events: Sequence[ValidEvent]) -> str | None:
    """The protocol of the first usage among one run's events of a request: what the run
    records if it has none yet. ``None`` when the request brings the run no usage."""
    return next((e.protocol for e in events if e.type == USAGE_TYPE), None)


@dataclass(frozen=True, slots=True)
class Screened:
    """A request's events with the usage its runs' protocols refuse taken out."""

    events: list[ValidEvent]
    refused: dict[tuple[str, str], str]  # (source, id) → reason, for OTLP's partial_success


def screen_usage(
    events: Sequence[ValidEvent], recorded: Mapping[str, str | None], *, single: bool
) -> Screened:
    """Keep the events whose run takes them: usage through the protocol ``recorded`` for its
    run (by subject, read under the run's lock), and every event that is not usage.

    A CloudEvents batch is atomic, so a refused CloudEvent raises 422
    ``usage_protocol_conflict`` naming each one's path; an exporter never fixes a batch, so
    a refused span is only taken out, with its reason (``spans.py``).
    """
    kept: list[ValidEvent] = []
    refused: dict[tuple[str, str], str] = {}
    errors: list[FieldError] = []
    for event in events:
        protocol = recorded.get(event.subject)
        if event.type != USAGE_TYPE or protocol is None or protocol == event.protocol:
            kept.append(event)
        elif event.protocol == OTLP:
            refused[(event.source, event.id)] = conflict_message(event.subject, protocol)
        else:
            path = "$.subject" if single else f"$[{event.index}].subject"
            errors.append(
                FieldError(path, CONFLICT_CODE, conflict_message(event.subject, protocol))
            )
    if errors:
        raise validation_error(errors)
    return Screened(kept, refused)
