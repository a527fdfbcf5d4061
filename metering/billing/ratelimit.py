"""A client-side rate limit for Stripe calls: a token bucket shared by a process's threads.

Stripe allows 100 operations per second in live mode (25 in a sandbox) and, separately,
1000 meter events per second ("Rate limits"); going over earns 429s that cost a retry each.
Waiting here instead keeps a push round under the limit. Per process: several pushers in
several processes should divide the rate between them through the settings.
"""

from __future__ import annotations

import threading
import time
from functools import lru_cache


class RateLimiter:
    """``rate_per_s`` calls per second on average, bursts of up to one second's worth."""

    def __init__(self, rate_per_s: float) -> None:
        self._rate = rate_per_s
        self._capacity = max(1.0, rate_per_s)
        self._tokens = self._capacity
        self._updated = time.monotonic()
        self._lock = threading.Lock()

    def acquire(self) -> None:
        """Take one token, sleeping until one is available (never when the rate is 0: off)."""
        if self._rate <= 0:
            return
        while True:
            with self._lock:
                now = time.monotonic()
                elapsed = now - self._updated
                self._tokens = min(self._capacity, self._tokens + elapsed * self._rate)
                self._updated = now
                if self._tokens >= 1:
                    self._tokens -= 1
                    return
                wait_s = (1 - self._tokens) / self._rate
            time.sleep(wait_s)


@lru_cache(maxsize=8)
def shared_limiter(rate_per_s: float) -> RateLimiter:
    """The process's limiter for this rate (one bucket per configured rate)."""
    return RateLimiter(rate_per_s)
