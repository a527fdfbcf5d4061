"""Rate limits per API key, counted in Redis so that every API process shares them.

A fixed window per key id (per client address for requests without a valid key), with the
limit chosen by the key's scope. Every limited response carries the IETF draft headers
``RateLimit-Limit``, ``RateLimit-Remaining`` and ``RateLimit-Reset``; over the limit the
reply is a 429 problem document with ``Retry-After``.

The limiter fails open: when Redis cannot be reached it logs a warning, stops asking Redis for
``rate_limit_redis_retry_s`` seconds, and lets requests through — ingest must not go down
with Redis.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Any

import redis
from anyio import to_thread
from litestar.middleware import DefineMiddleware
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from api.auth import KeyStore
from api.problems import PROBLEM_JSON
from metering.config import Settings
from metering.errors import MeteringError
from metering.keys import Scope as KeyScope

log = logging.getLogger("fairmeter.ratelimit")

# Probes and scrapers are never limited: a flood must not make the service look dead.
UNLIMITED_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})

# INCR, and start the window on the first hit; PTTL is the time left in the window. The
# `ttl < 0` branch also repairs a counter that somehow lost its expiry.
_WINDOW_SCRIPT = """
local count = redis.call('INCR', KEYS[1])
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
  ttl = tonumber(ARGV[1])
end
return {count, ttl}
"""


@dataclass(frozen=True, slots=True)
class Verdict:
    """One request's standing in its window."""

    limit: int
    remaining: int
    reset_s: int
    allowed: bool

    def headers(self) -> list[tuple[bytes, bytes]]:
        pairs = [
            (b"ratelimit-limit", str(self.limit).encode()),
            (b"ratelimit-remaining", str(self.remaining).encode()),
            (b"ratelimit-reset", str(self.reset_s).encode()),
        ]
        if not self.allowed:
            pairs.append((b"retry-after", str(self.reset_s).encode()))
        return pairs


class RateLimiter:
    """Counts requests per bucket in Redis; ``None`` verdicts mean "Redis is down: let it in"."""

    def __init__(self, client: redis.Redis, keys: KeyStore, settings: Settings) -> None:
        self._script = client.register_script(_WINDOW_SCRIPT)
        self._keys = keys
        self._settings = settings
        self._window_ms = max(1, int(settings.rate_limit_window_s * 1000))
        self._limits = {
            KeyScope.INGEST: settings.rate_limit_ingest_requests,
            KeyScope.CUSTOMER: settings.rate_limit_customer_requests,
            KeyScope.SUPPORT: settings.rate_limit_support_requests,
            KeyScope.ADMIN: settings.rate_limit_admin_requests,
        }
        self._redis_down_until = 0.0
        self._lock = threading.Lock()

    def bucket(self, authorization: str, client_host: str) -> tuple[str, int]:
        """The bucket and limit of a request: its key id when the key is valid (so nobody can
        spend another key's budget with a forged key), else the client address."""
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            try:
                principal = self._keys.authenticate(token.strip())
            except MeteringError:
                pass  # not a valid key: limited by address, the handler answers 401
            except Exception:  # the database is down: the handler answers 503
                log.debug("rate limiter: key lookup failed, limiting by address")
            else:
                return f"key:{principal.key_id}", self._limits[principal.scope]
        return f"ip:{client_host}", self._settings.rate_limit_anonymous_requests

    def hit(self, bucket: str, limit: int) -> Verdict | None:
        """Count one request against ``bucket``; ``None`` when Redis cannot be asked."""
        if time.monotonic() < self._redis_down_until:
            return None
        try:
            count, ttl_ms = self._script(
                keys=[f"{self._settings.rate_limit_redis_prefix}:{bucket}"],
                args=[self._window_ms],
            )
        except redis.RedisError as exc:
            self._open_circuit(exc)
            return None
        reset_s = max(1, math.ceil(int(ttl_ms) / 1000))
        return Verdict(limit, max(0, limit - int(count)), reset_s, int(count) <= limit)

    def check(self, authorization: str, client_host: str) -> Verdict | None:
        bucket, limit = self.bucket(authorization, client_host)
        return self.hit(bucket, limit)

    def _open_circuit(self, exc: Exception) -> None:
        retry_s = self._settings.rate_limit_redis_retry_s
        with self._lock:
            self._redis_down_until = time.monotonic() + retry_s
        log.warning(
            "rate limiter: Redis unavailable (%s); letting requests through unlimited for %.0fs",
            exc.__class__.__name__,
            retry_s,
        )


def _header(scope: Scope, name: bytes) -> str:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return ""


async def _send_429(send: Send, verdict: Verdict) -> None:
    body = json.dumps(
        {
            "type": "https://fairmeter.dev/problems/rate_limited",
            "title": "Too many requests",
            "status": 429,
            "code": "rate_limited",
            "detail": f"more than {verdict.limit} requests in this window; retry later",
            "retry_after_s": verdict.reset_s,
        }
    ).encode()
    headers = [
        (b"content-type", PROBLEM_JSON.encode()),
        (b"content-length", str(len(body)).encode()),
        *verdict.headers(),
    ]
    await send({"type": "http.response.start", "status": 429, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _middleware(app: ASGIApp, limiter: RateLimiter) -> ASGIApp:
    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UNLIMITED_PATHS:  # type: ignore[comparison-overlap]
            await app(scope, receive, send)
            return
        client = scope.get("client")
        host = client[0] if client else "unknown"
        verdict = await to_thread.run_sync(limiter.check, _header(scope, b"authorization"), host)
        if verdict is None:
            await app(scope, receive, send)
            return
        if not verdict.allowed:
            await _send_429(send, verdict)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *verdict.headers()]}
            await send(message)

        await app(scope, receive, send_with_headers)

    return middleware


def rate_limit_middleware(client: redis.Redis, keys: KeyStore, settings: Settings) -> Any:
    """The middleware for ``Litestar(middleware=[...])``; one limiter shared by every route."""
    if not settings.rate_limit_enabled:
        return DefineMiddleware(_passthrough)
    return DefineMiddleware(_middleware, limiter=RateLimiter(client, keys, settings))


def _passthrough(app: ASGIApp) -> ASGIApp:
    return app
