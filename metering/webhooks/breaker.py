"""An endpoint's circuit breaker: how many sends it may have at once, from how its recent
attempts went.

Pure: the caller passes the time and the settings' pauses. Closed (its last attempt
answered): the endpoint's full share of a round's send slots. After ``HALF_OPEN_AFTER``
failures in a row (a timeout, a refused connection, a 5xx or a 429: the receiver is down
or overloaded) it is half-open: one probing send at a time, so a hanging receiver holds one
thread instead of eight that would all time out. From ``OPEN_AFTER`` failures in a row,
each failure opens it: no send at all for a pause that doubles with every further failure,
from ``pause_s`` up to ``max_pause_s``; when the pause has passed it is half-open again
(one probe). One answered attempt closes it. Messages not sent meanwhile keep their place
and their retries: a breaker delays an endpoint's messages, it never fails them.

``allowance`` is what the claim applies (``metering/webhooks/delivery.py`` reads it in
SQL from the endpoint's ``breaker_failures`` and ``breaker_open_until``, with
``HALF_OPEN_AFTER`` passed in, so the rule is written once).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

HALF_OPEN_AFTER = 2
OPEN_AFTER = 4


@dataclass(frozen=True, slots=True)
class Breaker:
    failures: int = 0  # failed attempts in a row since the last answered one
    open_until: datetime | None = None  # no send before this


def trips(status_code: int | None, error: str | None) -> bool:
    """Whether an attempt's failure says the receiver is down or overloaded (no answer, a
    5xx, a 429), rather than refusing this one message (another 4xx: it answered)."""
    if status_code is None:
        return error is not None
    return status_code >= 500 or status_code == 429


def pause(failures: int, pause_s: float, max_pause_s: float) -> timedelta:
    """How long the breaker stays open after failure number ``failures`` in a row."""
    steps = min(failures - OPEN_AFTER, 32)  # 2 ** 32 of any pause is past any cap
    return timedelta(seconds=min(max_pause_s, pause_s * 2**steps))


def after_attempt(
    breaker: Breaker,
    *,
    tripped: bool,
    now: datetime,
    pause_s: float,
    max_pause_s: float,
) -> Breaker:
    """The breaker once an attempt has ended: closed by an answer, else one more failure,
    opened for a pause from ``OPEN_AFTER`` failures on."""
    if not tripped:
        return Breaker()
    failures = breaker.failures + 1
    if failures < OPEN_AFTER:
        return Breaker(failures, breaker.open_until)
    return Breaker(failures, now + pause(failures, pause_s, max_pause_s))


def allowance(breaker: Breaker, now: datetime, share: int) -> int:
    """Sends the endpoint may have at once: 0 while open, 1 while half-open, else ``share``."""
    if breaker.open_until is not None and now < breaker.open_until:
        return 0
    if breaker.failures >= HALF_OPEN_AFTER:
        return 1
    return share
