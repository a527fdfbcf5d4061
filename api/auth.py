"""Bearer-key authentication: parse, look up by key id (cached), verify the HMAC."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from typing import Any

from litestar import Request
from sqlalchemy.engine import Engine

from metering.db import raw_transaction
from metering.errors import forbidden, unauthenticated
from metering.keys import ParsedKey, Principal, Scope, hmac_matches, parse_key
from metering.keys_repo import StoredKey, find_key


class KeyStore:
    """Looks keys up by id with a short per-process cache.

    The cache bounds database reads on hot paths; a revoked key stops working within
    ``ttl_s`` seconds (documented in the README).
    """

    def __init__(self, engine: Engine, pepper: str, ttl_s: float) -> None:
        self._engine = engine
        self._pepper = pepper
        self._ttl_s = ttl_s
        self._cache: dict[str, tuple[float, StoredKey | None]] = {}
        self._lock = threading.Lock()

    def _lookup(self, key_id: str) -> StoredKey | None:
        now = time.monotonic()
        cached = self._cache.get(key_id)
        if cached and now - cached[0] < self._ttl_s:
            return cached[1]
        with raw_transaction(self._engine) as conn:
            stored = find_key(conn, key_id)
        with self._lock:
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[key_id] = (now, stored)
        return stored

    def authenticate(self, raw: str) -> Principal:
        return self._verify(raw, self._lookup(_parse(raw).key_id))

    def authenticate_cached(self, raw: str) -> Principal | None:
        """``authenticate`` without touching the database: ``None`` when the key is not in
        the cache (or its entry is stale), so the caller can look it up off the event loop."""
        cached = self._cache.get(_parse(raw).key_id)
        if cached is None or time.monotonic() - cached[0] >= self._ttl_s:
            return None
        return self._verify(raw, cached[1])

    def _verify(self, raw: str, stored: StoredKey | None) -> Principal:
        if stored is None or not hmac_matches(raw, self._pepper, stored.secret_hmac):
            raise unauthenticated("the API key is not valid")
        now = datetime.now(UTC)
        if stored.revoked_at is not None:
            raise unauthenticated("the API key was revoked")
        if stored.expires_at is not None and stored.expires_at <= now:
            raise unauthenticated("the API key has expired")
        return Principal(stored.tenant_id, stored.scope, stored.key_id, stored.customer_id)

    def active_principal(self, key_id: str) -> Principal | None:
        """The principal of a key that was authenticated earlier (a console session), while
        the key still exists and is neither revoked nor expired; cached like ``authenticate``."""
        stored = self._lookup(key_id)
        if stored is None or stored.revoked_at is not None:
            return None
        if stored.expires_at is not None and stored.expires_at <= datetime.now(UTC):
            return None
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
