"""Idempotency keys: the first executed response is kept and replayed for the same request.

Same key + same method, path and parameters → the stored status and body again, with
``Idempotent-Replayed: true``. Same key + different parameters (or endpoint) → 400
``idempotency_error``. Same key while the first request is still running → 409. Keys expire
``idempotency_window_s`` after first use, measured on the emulator clock.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from devtools.stripe_emulator.errors import (
    idempotency_endpoint,
    idempotency_in_use,
    idempotency_params,
)
from devtools.stripe_emulator.forms import fingerprint

PRUNE_EVERY = 1000


@dataclass
class StoredResponse:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    request_id: str = ""


@dataclass
class _Entry:
    endpoint: str
    fingerprint: str
    first_seen: int
    response: StoredResponse | None = None  # None while the first request runs


class IdempotencyStore:
    """Thread-safe map from key to the response its first request produced."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        self._writes = 0

    def begin(
        self, key: str, endpoint: str, params: dict[str, object], now: int, window_s: int
    ) -> StoredResponse | None:
        """Claim ``key`` for a new request, or return the response to replay.

        Raises StripeError on a mismatch or while another request holds the key.
        """
        print_ = fingerprint(endpoint, params)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and now - entry.first_seen >= window_s:
                entry = None
            if entry is None:
                self._entries[key] = _Entry(endpoint, print_, now)
                return None
            if entry.endpoint != endpoint:
                raise idempotency_endpoint(key, entry.endpoint, endpoint)
            if entry.fingerprint != print_:
                raise idempotency_params(key)
            if entry.response is None:
                raise idempotency_in_use(key)
            return entry.response

    def finish(self, key: str, response: StoredResponse, now: int, window_s: int) -> None:
        """Keep the response the claimed request produced."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                entry.response = response
            self._writes += 1
            if self._writes % PRUNE_EVERY == 0:
                self._prune(now, window_s)

    def abandon(self, key: str) -> None:
        """Release a claim without storing anything (the request never executed)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry.response is None:
                del self._entries[key]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    def _prune(self, now: int, window_s: int) -> None:
        expired = [
            key
            for key, entry in self._entries.items()
            if entry.response is not None and now - entry.first_seen >= window_s
        ]
        for key in expired:
            del self._entries[key]
