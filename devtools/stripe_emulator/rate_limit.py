"""Stripe's global API rate limit, per wall-clock second, answered with 429 ``rate_limit``.

Stripe's basic limiter allows 100 operations per second in live mode (25 in a sandbox), and
meter-event creation has its own, separate limit (1,000 per second in live mode) that does not
count against the basic one. The emulator measures real time (``time.monotonic``), not its
own clock: a rate limit is about how fast requests arrive.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from devtools.stripe_emulator.errors import rate_limited
from devtools.stripe_emulator.settings import EmulatorSettings

METER_EVENTS_PATH = "/v1/billing/meter_events"
WINDOW_S = 1.0


class RateLimiter:
    """Sliding one-second windows: the global bucket and the meter-events bucket."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._admitted: dict[str, deque[float]] = {"global": deque(), "meter_events": deque()}

    def admit(self, method: str, path: str, settings: EmulatorSettings) -> None:
        """Count this request, or raise Stripe's 429 when its bucket is full."""
        if method == "POST" and path == METER_EVENTS_PATH:
            bucket, limit = "meter_events", settings.meter_event_rate_limit_per_s
        else:
            bucket, limit = "global", settings.rate_limit_per_s
        if limit is None:
            return
        now = time.monotonic()
        with self._lock:
            admitted = self._admitted[bucket]
            while admitted and admitted[0] <= now - WINDOW_S:
                admitted.popleft()
            if len(admitted) >= limit:
                raise rate_limited()
            admitted.append(now)

    def clear(self) -> None:
        with self._lock:
            for admitted in self._admitted.values():
                admitted.clear()
