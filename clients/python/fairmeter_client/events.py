"""Building the CloudEvents of docs/events.md (structured-mode dicts), with early checks.

The checks mirror the server's catalogue so a typo fails at the call site with a
``ValueError`` instead of turning into a dead letter minutes later. What only the server
knows (the price catalog's models, the run's owner) is still checked there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from fairmeter_client.ids import event_id

MAX_COUNT: Final = 10**12
MAX_STEP: Final = 10**9
MAX_TEXT: Final = 255
DELIVERY_KINDS: Final = ("final", "partial", "changes")
TOOL_STATUSES: Final = ("completed", "failed")
SIDES: Final = ("server", "client")
CANCELLED_BY: Final = ("user", "system")
FAILURE_CAUSES: Final = ("network", "server", "provider", "tool", "client", "unknown")
# Types without a natural key: a per-run sequence from the spool tells them apart.
SEQUENCED_TYPES: Final = frozenset({"run.heartbeat", "connection.lost", "connection.restored"})


@dataclass(frozen=True, slots=True)
class Draft:
    """An event before it has an id and a time: type, data (without customer), natural key."""

    type: str
    attempt: int
    data: dict[str, Any]
    key: dict[str, Any] = field(default_factory=dict)
    at: datetime | None = None  # when it happened; None: when it is reported

    @property
    def sequenced(self) -> bool:
        return self.type in SEQUENCED_TYPES and "key" not in self.key


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def to_cloudevent(
    draft: Draft,
    *,
    source: str,
    run: str,
    customer: str,
    seq: int | None,
    now: datetime,
) -> dict[str, Any]:
    """The structured-mode CloudEvent for ``draft``; ``seq`` only for sequenced drafts."""
    key = dict(draft.key)
    if seq is not None:
        key["seq"] = seq
    return {
        "specversion": "1.0",
        "id": event_id(run, draft.type, draft.attempt, key),
        "source": source,
        "type": draft.type,
        "subject": run,
        "time": rfc3339(draft.at or now),
        "datacontenttype": "application/json",
        "data": {"customer": customer, "attempt": draft.attempt, **draft.data},
    }


def count(name: str, value: int, *, low: int = 0, high: int = MAX_COUNT) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} must be an integer between {low} and {high}, not {value!r}")
    return value


def step(value: int) -> int:
    return count("step", value, high=MAX_STEP)


def attempt(value: int) -> int:
    return count("attempt", value, low=1, high=MAX_STEP)


def text(name: str, value: str, limit: int = MAX_TEXT) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= limit:
        raise ValueError(f"{name} must be a string of 1 to {limit} characters, not {value!r}")
    return value


def optional_text(name: str, value: str | None) -> str | None:
    return None if value is None else text(name, value)


def choice(name: str, value: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, not {value!r}")
    return value


def moment(value: datetime | None) -> datetime | None:
    if value is not None and (not isinstance(value, datetime) or value.tzinfo is None):
        raise ValueError(f"at must be a timezone-aware datetime, not {value!r}")
    return value


def draft(
    event_type: str,
    run_attempt: int,
    data: Mapping[str, Any],
    natural_key: Mapping[str, Any],
    extra_key: str | None,
    at: datetime | None = None,
) -> Draft:
    """A draft whose data leaves out ``None`` fields (the server has no nulls to store)."""
    key = dict(natural_key)
    if extra_key is not None:
        key["key"] = text("key", extra_key)
    clean = {name: value for name, value in data.items() if value is not None}
    return Draft(event_type, attempt(run_attempt), clean, key, moment(at))
