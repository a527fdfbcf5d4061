"""When a failed delivery is tried again, when it is given up, and when an endpoint is.

Pure: the caller passes the time and the random draw. A message is tried at once, then
after each wait of the schedule (5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h by default: eight
attempts over about 28 hours); a failure after the last wait fails the message for good
(visible in the delivery log, and redeliverable). Each wait is jittered by up to a fifth
either way, so the messages a receiver's outage failed together do not all come back in
the same second.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

JITTER = 0.2


@dataclass(frozen=True, slots=True)
class Retry:
    """The attempt failed; the next one is due at ``at``."""

    at: datetime


@dataclass(frozen=True, slots=True)
class GiveUp:
    """The attempt failed and it was the last of the schedule: the message is failed."""


def jittered(delay_s: float, draw: float) -> float:
    """``delay_s`` moved by up to ``JITTER`` of itself; ``draw`` is uniform in [0, 1)."""
    return delay_s * (1 + JITTER * (2 * draw - 1))


def after_failure(
    tries: int, now: datetime, schedule_s: Sequence[float], draw: Callable[[], float]
) -> Retry | GiveUp:
    """What follows the failure of try number ``tries`` (1 for the first) of a message."""
    if tries > len(schedule_s):
        return GiveUp()
    return Retry(now + timedelta(seconds=jittered(schedule_s[tries - 1], draw())))


def should_disable(failing_since: datetime | None, now: datetime, disable_after_s: float) -> bool:
    """Whether an endpoint whose every attempt has failed since ``failing_since`` is to be
    disabled now (one success clears ``failing_since``)."""
    return failing_since is not None and now - failing_since >= timedelta(seconds=disable_after_s)


def disabled_reason(failing_since: datetime, now: datetime) -> str:
    """What the tenant's admin reads on the endpoint."""
    return (
        f"every delivery attempt failed for {_duration((now - failing_since).total_seconds())} "
        f"(since {failing_since.isoformat()}); "
        "fix the receiver, then enable the endpoint (its pending messages resume) and "
        "redeliver what failed"
    )


def _duration(seconds: float) -> str:
    for unit, size in (("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds:.0f} s"
