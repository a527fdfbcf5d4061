"""Injected faults: what the next Stripe API request suffers, by queue or at random.

Kinds:
- ``429``: answer 429 ``rate_limit`` without processing.
- ``500``: answer 500 ``api_error`` without processing.
- ``timeout``: stall ``timeout_s`` without processing, then close the connection unanswered.
- ``drop_after_commit``: process and store (under the idempotency key too), then close the
  connection without a response.
- ``slow``: process, then hold the request (and its per-customer meter slot) ``slow_s``
  before answering — makes overlaps deterministic.
- ``stored_500``: process nothing, but keep a 500 ``api_error`` as the idempotency key's first
  response; every retry with the key replays that 500 until the key lapses (Stripe saves the
  first response of a key, "including 500 errors").
- ``stored_500_after_commit``: process and commit, then answer (and keep) a 500 the same way.
- ``none``: a placeholder in a queue, so ``["none", "500"]`` faults the second request.
"""

from __future__ import annotations

import random
import threading
from collections import deque
from typing import Any

KINDS = (
    "429",
    "500",
    "timeout",
    "drop_after_commit",
    "slow",
    "stored_500",
    "stored_500_after_commit",
    "none",
)
BEFORE_PROCESSING = frozenset({"429", "500", "timeout"})


class FaultPlan:
    """A queue of explicit next faults, then a random rate; both filtered by path and method."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.clear()

    def clear(self) -> None:
        with self._lock:
            self._queue: deque[str] = deque()
            self._rate = 0.0
            self._kinds: list[str] = []
            self._rng = random.Random()
            self._path: str | None = None
            self._method: str | None = None

    def configure(self, plan: dict[str, Any]) -> None:
        """Replace the plan. Keys: next, rate, kinds, seed, path (a prefix), method."""
        unknown = set(plan) - {"next", "rate", "kinds", "seed", "path", "method"}
        if unknown:
            raise ValueError(f"unknown fault plan keys: {sorted(unknown)}")
        queue = [str(kind) for kind in plan.get("next", [])]
        kinds = [str(kind) for kind in plan.get("kinds", ["429", "500"])]
        for kind in [*queue, *kinds]:
            if kind not in KINDS:
                raise ValueError(f"unknown fault kind {kind!r}; known: {list(KINDS)}")
        rate = float(plan.get("rate", 0.0))
        if not 0.0 <= rate <= 1.0:
            raise ValueError("rate must be between 0 and 1")
        with self._lock:
            self._queue = deque(queue)
            self._rate = rate
            self._kinds = kinds
            self._rng = random.Random(plan.get("seed"))
            self._path = plan.get("path")
            method = plan.get("method")
            self._method = str(method).upper() if method else None

    def draw(self, method: str, path: str) -> str | None:
        """The fault for this request, or None."""
        with self._lock:
            if self._path is not None and not path.startswith(self._path):
                return None
            if self._method is not None and method != self._method:
                return None
            if self._queue:
                kind = self._queue.popleft()
                return None if kind == "none" else kind
            if self._rate and self._rng.random() < self._rate:
                return self._rng.choice(self._kinds)
            return None

    def describe(self) -> dict[str, Any]:
        with self._lock:
            return {
                "next": list(self._queue),
                "rate": self._rate,
                "kinds": list(self._kinds),
                "path": self._path,
                "method": self._method,
            }
