"""Stripe's API rate limits, per wall-clock second, answered with 429 ``rate_limit``.

"Rate limits" (https://docs.stripe.com/rate-limits): the global limiter allows 100 operations
per second in live mode and 25 in a sandbox; "API endpoints have a default limit of 25
requests per second", and calls to an endpoint "also count against global limits"; "each
named API operation" is a separate endpoint (``POST /v1/payment_intents`` and
``GET /v1/payment_intents/{id}`` are two), and requests to one path pattern for different ids
count towards the same endpoint limit. Meter-event creation has its own limit (1,000 per
second in live mode) that does not count against the basic one. The emulator measures real
time (``time.monotonic``), not its own clock: a rate limit is about how fast requests arrive.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from devtools.stripe_emulator.errors import rate_limited
from devtools.stripe_emulator.settings import EmulatorSettings

METER_EVENTS_ENDPOINT = "POST /v1/billing/meter_events"
WINDOW_S = 1.0


class RateLimiter:
    """Sliding one-second windows: global, one per endpoint, and the meter-events bucket."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._admitted: dict[str, deque[float]] = {}

    def admit(self, endpoint: str, settings: EmulatorSettings) -> None:
        """Count a request to ``endpoint`` ("METHOD pattern"), or raise Stripe's 429 when
        any bucket it counts against is full (then it counts against none)."""
        if endpoint == METER_EVENTS_ENDPOINT:
            buckets = [("meter_events", settings.meter_event_rate_limit_per_s)]
        else:
            buckets = [
                ("global", settings.rate_limit_per_s),
                (endpoint, settings.endpoint_rate_limit_per_s),
            ]
        limited = [(name, limit) for name, limit in buckets if limit is not None]
        now = time.monotonic()
        with self._lock:
            windows = [(self._window(name, now), limit) for name, limit in limited]
            if any(len(window) >= limit for window, limit in windows):
                raise rate_limited()
            for window, _ in windows:
                window.append(now)

    def _window(self, name: str, now: float) -> deque[float]:
        admitted = self._admitted.setdefault(name, deque())
        while admitted and admitted[0] <= now - WINDOW_S:
            admitted.popleft()
        return admitted

    def clear(self) -> None:
        with self._lock:
            self._admitted.clear()
