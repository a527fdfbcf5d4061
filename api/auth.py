"""Bearer-key authentication: parse, look up by key id (cached), verify the HMAC."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from datetime import UTC, datetime
from typing import Any

from litestar import Request
from sqlalchemy.engine import Engine

from api.metrics import record_key_lookup
from metering.db import raw_transaction
from metering.errors import forbidden, unauthenticated
from metering.keys import ParsedKey, Principal, Scope, hmac_matches, parse_key
from metering.keys_repo import StoredKey, find_key


class KeyStore:
    """Looks keys up by id with a short, bounded per-process cache.

    The cache bounds database reads on hot paths; a revoked key stops working within
    ``ttl_s`` seconds (documented in the README). Key ids that exist and key ids that do not
    are remembered apart, each up to ``max_ids``, the least recently used evicted first: a
    flood of forged ids is answered from the negative side without the database, and can
    only push other forged ids out, never the real keys.
    """

    def __init__(self, engine: Engine, pepper: str, ttl_s: float, max_ids: int = 10_000) -> None:
        self._engine = engine
        self._pepper = pepper
        self._ttl_s = ttl_s
        self._max_ids = max_ids
        self._found: OrderedDict[str, tuple[float, StoredKey]] = OrderedDict()
        self._unknown: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()
        self.lookups = 0  # database reads so far (also the fairmeter_key_lookups_total metric)

    def _cached(self, key_id: str) -> tuple[bool, StoredKey | None]:
        """``(True, key or None)`` when ``key_id`` is cached and fresh, else ``(False, None)``."""
        now = time.monotonic()
        with self._lock:
            found = self._found.get(key_id)
            if found is not None and now - found[0] < self._ttl_s:
                self._found.move_to_end(key_id)
                return True, found[1]
            unknown_at = self._unknown.get(key_id)
            if unknown_at is not None and now - unknown_at < self._ttl_s:
                self._unknown.move_to_end(key_id)
                return True, None
        return False, None

    def _remember(self, key_id: str, stored: StoredKey | None, at: float) -> None:
        with self._lock:
            self.lookups += 1
            self._found.pop(key_id, None)
            self._unknown.pop(key_id, None)
            if stored is None:
                self._unknown[key_id] = at
                cache: OrderedDict[str, Any] = self._unknown
            else:
                self._found[key_id] = (at, stored)
                cache = self._found
            while len(cache) > self._max_ids:
                cache.popitem(last=False)  # evict the least recently used, not everything

    def _lookup(self, key_id: str) -> StoredKey | None:
        known, cached = self._cached(key_id)
        if known:
            return cached
        now = time.monotonic()
        with raw_transaction(self._engine) as conn:
            stored = find_key(conn, key_id)
        record_key_lookup(found=stored is not None)
        self._remember(key_id, stored, now)
        return stored

    def was_found(self, raw: str) -> bool:
        """Whether ``raw``'s key id was found in the database before (its entry may be stale):
        a real key id, whose refresh the rate limiter does not make the client's address pay."""
        parsed = parse_key(raw)
        with self._lock:
            return parsed is not None and parsed.key_id in self._found

    def authenticate(self, raw: str) -> Principal:
        return self._verify(raw, self._lookup(_parse(raw).key_id))

    def authenticate_cached(self, raw: str) -> Principal | None:
        """``authenticate`` without touching the database: ``None`` when the key is not in
        the cache (or its entry is stale), so the caller can look it up off the event loop."""
        known, stored = self._cached(_parse(raw).key_id)
        return self._verify(raw, stored) if known else None

    def _verify(self, raw: str, stored: StoredKey | None) -> Principal:
        if stored is None or not hmac_matches(raw, self._pepper, stored.secret_hmac):
            raise unauthenticated("the API key is not valid")
        now = datetime.now(UTC)
        if stored.revoked_at is not None:
            raise unauthenticated("the API key was revoked")
        if stored.expires_at is not None and stored.expires_at <= now:
            raise unauthenticated("the API key has expired")
        return Principal(stored.tenant_id, stored.scope, stored.key_id, stored.customer_id)


def _parse(raw: str) -> ParsedKey:
    parsed = parse_key(raw)
    if parsed is None:
        raise unauthenticated("the API key is malformed")
    return parsed


def bearer_key(request: Request[Any, Any, Any]) -> str:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise unauthenticated("send the API key as 'Authorization: Bearer <key>'")
    return token.strip()


def require_scope(principal: Principal, *allowed: Scope) -> Principal:
    if principal.scope not in allowed:
        names = ", ".join(s.value for s in allowed)
        raise forbidden(f"this key has scope {principal.scope.value}; this needs one of: {names}")
    return principal
