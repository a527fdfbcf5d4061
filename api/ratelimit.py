"""Rate limits per API key, counted in Redis so that every API process shares them.

A fixed window per key id (per client address for requests without a valid key), with the
limit chosen by the key's scope. Every limited response carries the IETF draft headers
``RateLimit-Limit``, ``RateLimit-Remaining`` and ``RateLimit-Reset``; over the limit the
reply is a 429 problem document with ``Retry-After``. Ingest keys also have an events budget
per window, spent by each batch's event count after it is validated (``spend_event_budget``),
so batching does not multiply what a key may store; and every tenant has one across all its
keys (``rate_limit_tenant_events``), so issuing more keys (one per end customer, say) does
not multiply what one tenant may take of the deployment's ingest either.

A key id that no API process has found in the database lately is counted against the
client address *before* it is looked up: forged keys with fresh ids, which would each cost a
database read, cost at most the anonymous limit's worth per window. The key ids found are
shared in Redis (``<prefix>:found:<key id>``, kept for ``rate_limit_found_key_ttl_s``, a
week, renewed by each lookup that finds it again), because a process's own memory is not
enough: behind a proxy or a NAT many clients share an address, and one tenant's forged flood
at a freshly started process would otherwise refuse another tenant's first request there.
The memory outlasts the key cache (30 s) because a key idle for longer is just as real: with
the cache's TTL, a tenant's first request after a quiet minute was refused by a flood. Only
ids found in the database are written, so a flood adds nothing to Redis; each forged key
costs one Redis read (``EXISTS``), also once the address's budget is spent, but never a
database read; a remembered id costs a process one lookup per key cache TTL, and one that
turns out revoked is then paid for by the address like any invalid key.

The address is the connecting peer's, or the ``X-Forwarded-For`` client when the peer is one
of ``trusted_proxies`` (api/forwarded.py). Behind a load balancer or reverse proxy
``FAIRMETER_TRUSTED_PROXIES`` is REQUIRED: without it every client arrives from the proxy's
address, all of them share that one anonymous budget, and one client's flood of forged keys
(or of requests without a key) gets every other client's unauthenticated requests, and the
first request of any key no process has found within ``rate_limit_found_key_ttl_s``,
refused with 429. Set it to the proxy's addresses (comma-separated IPs or CIDRs, e.g.
``10.0.0.0/8``); api/forwarded.py logs one warning per process when a peer that is not
listed sends ``X-Forwarded-For``.

Counting is asynchronous (``redis.asyncio``, no thread per request) and, for large limits,
leased: a process takes 1 % of a window's budget from Redis in one ``INCRBY`` and spends it
locally, so an ingest key at 5,000 requests/s costs Redis one call per 50 requests instead
of one per request. Limits under 100 are leased one request at a time, i.e. counted
exactly. A request costing more than a lease (a large batch's events) leases what it
needs; one that does not fit in what is left of the window is refused whole, and the window
is then spent. What a process leased but did not spend before the window ends is lost to the
others: at most 1 % of the limit per API process and window.

The limiter fails open: when Redis cannot be reached it logs a warning, stops asking Redis for
``rate_limit_redis_retry_s`` seconds, and lets requests through — ingest must not go down
with Redis.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio
from anyio import to_thread
from litestar.middleware import DefineMiddleware
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from api.auth import KeyStore
from api.metrics import record_rejection
from api.otlp_errors import TRACES_PATH, status_body
from api.problems import PROBLEM_JSON
from metering.config import Settings
from metering.errors import MeteringError, rate_limited
from metering.keys import Scope as KeyScope
from metering.keys import parse_key

log = logging.getLogger("fairmeter.ratelimit")

# Probes and scrapers are never limited: a flood must not make the service look dead.
UNLIMITED_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})

# INCRBY a lease, and start the window on the first hit; PTTL is the time left in the
# window. The `ttl < 0` branch also repairs a counter that somehow lost its expiry.
_WINDOW_SCRIPT = """
local count = redis.call('INCRBY', KEYS[1], ARGV[2])
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
  ttl = tonumber(ARGV[1])
end
return {count, ttl}
"""
MAX_LEASES = 10_000  # buckets remembered per process; expired ones are dropped beyond this


def lease_size(limit: int) -> int:
    """Requests taken from Redis at once: 1 % of the limit, one at a time below 100."""
    return max(1, limit // 100)


@dataclass(slots=True)
class _Lease:
    """Budget this process took from a bucket's window and has not spent yet."""

    ends_at: float  # monotonic time the window ends
    last_count: int  # the window's count the last leased request stands at
    left: int
    exhausted: bool = False  # the window's budget is spent: refuse until it ends


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
    """Counts requests per bucket in Redis; ``None`` verdicts mean "Redis is down: let it in".

    Lives on one event loop (its leases are not locked).
    """

    def __init__(self, client: redis.asyncio.Redis, keys: KeyStore, settings: Settings) -> None:
        self._redis = client
        self._script = client.register_script(_WINDOW_SCRIPT)
        self._found_ttl_ms = max(1, int(settings.rate_limit_found_key_ttl_s * 1000))
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
        self._leases: dict[str, _Lease] = {}
        self._refills: dict[str, asyncio.Lock] = {}

    async def hit(self, bucket: str, limit: int, cost: int = 1) -> Verdict | None:
        """Count ``cost`` units (one request, or a batch's events) against ``bucket``; ``None``
        when Redis cannot be asked. What does not fit is refused whole."""
        if time.monotonic() < self._redis_down_until:
            return None
        verdict = self._from_lease(bucket, limit, cost)
        if verdict is not None:
            return verdict
        # One refill per bucket at a time: concurrent requests that found the lease spent
        # wait for it and use the new lease, instead of each leasing (and wasting) its own.
        async with self._refills.setdefault(bucket, asyncio.Lock()):
            verdict = self._from_lease(bucket, limit, cost)
            if verdict is not None:
                return verdict
            return await self._lease(bucket, limit, cost)

    def _from_lease(self, bucket: str, limit: int, cost: int) -> Verdict | None:
        """This request's verdict from the budget at hand; ``None`` when Redis must be asked."""
        now = time.monotonic()
        lease = self._leases.get(bucket)
        if lease is None or now >= lease.ends_at:
            return None
        reset_s = max(1, math.ceil(lease.ends_at - now))
        if lease.exhausted:
            return Verdict(limit, 0, reset_s, False)
        if lease.left < cost:
            return None
        lease.left -= cost
        return Verdict(limit, limit - (lease.last_count - lease.left), reset_s, True)

    async def _lease(self, bucket: str, limit: int, cost: int) -> Verdict | None:
        held = self._leases.get(bucket)
        live = held is not None and time.monotonic() < held.ends_at and not held.exhausted
        carried = held.left if held is not None and live else 0  # leased, not yet spent
        size = max(lease_size(limit), cost - carried)
        try:
            total, ttl_ms = await self._script(
                keys=[f"{self._settings.rate_limit_redis_prefix}:{bucket}"],
                args=[self._window_ms, size],
            )
        except redis.RedisError as exc:
            self._open_circuit(exc)
            return None
        granted = min(size, max(0, limit - (int(total) - size)))  # the part within the limit
        ends_at = time.monotonic() + int(ttl_ms) / 1000
        reset_s = max(1, math.ceil(int(ttl_ms) / 1000))
        if carried + granted < cost:  # spent: refuse locally until the window ends
            self._remember(bucket, _Lease(ends_at, limit, 0, exhausted=True))
            return Verdict(limit, 0, reset_s, False)
        last_count = min(int(total), limit)  # where the window stands once this lease is spent
        left = carried + granted - cost
        self._remember(bucket, _Lease(ends_at, last_count, left))
        return Verdict(limit, limit - (last_count - left), reset_s, True)

    async def check(self, authorization: str, client_host: str) -> Verdict | None:
        """One request's verdict: counted against its key id when the key is valid (so
        nobody can spend another key's budget with a forged key), else its client address.

        A key id that no process has found lately is paid for out of the address's budget
        *before* it is looked up: forged keys with fresh key ids then cost at most the
        anonymous limit in database reads per window, and none once it is spent (unknown ids
        are cached too). A key id found by this process or, within
        ``rate_limit_found_key_ttl_s``, by any other, skips that budget: another tenant's
        flood from the same address cannot refuse it.
        """
        address = f"ip:{client_host}", self._settings.rate_limit_anonymous_requests
        token = _bearer_token(authorization)
        if token is None:
            return await self.hit(*address)
        try:
            principal = self._keys.authenticate_cached(token)
        except MeteringError:  # malformed, or known to be invalid: the handler answers 401
            return await self.hit(*address)
        if principal is None:  # a lookup ahead
            key_id = _key_id(token)
            paid: Verdict | None = None
            if not (self._keys.was_found(token) or await self._found_elsewhere(key_id)):
                paid = await self.hit(*address)
                if paid is not None and not paid.allowed:
                    return paid
            try:
                principal = await to_thread.run_sync(self._keys.authenticate, token)
            except MeteringError:  # not a valid key: limited by address, the handler says 401
                await self._share_if_found(token, key_id)  # a real id with a bad secret
                return paid or await self.hit(*address)
            except Exception:  # the database is down: the handler answers 503
                log.debug("rate limiter: key lookup failed, limiting by address")
                return paid or await self.hit(*address)
            await self._share_if_found(token, key_id)
        return await self.hit(f"key:{principal.key_id}", self._limits[principal.scope])

    async def _found_elsewhere(self, key_id: str) -> bool:
        """Whether some API process found ``key_id`` in the database within
        ``rate_limit_found_key_ttl_s`` (False when Redis cannot be asked: the address's hit
        then lets it through)."""
        if time.monotonic() < self._redis_down_until:
            return False
        try:
            return bool(await self._redis.exists(self._found_key(key_id)))
        except redis.RedisError as exc:
            self._open_circuit(exc)
            return False

    async def _share_if_found(self, token: str, key_id: str) -> None:
        """Tell the other processes that ``key_id`` exists, for ``rate_limit_found_key_ttl_s``;
        called after each database lookup, so a key in use stays shared and a forged id never
        is."""
        if not self._keys.was_found(token) or time.monotonic() < self._redis_down_until:
            return
        try:
            await self._redis.set(self._found_key(key_id), 1, px=self._found_ttl_ms)
        except redis.RedisError as exc:
            self._open_circuit(exc)

    def _found_key(self, key_id: str) -> str:
        return f"{self._settings.rate_limit_redis_prefix}:found:{key_id}"

    async def spend_tenant_events(self, tenant: str, events: int) -> Verdict | None:
        """Count a batch's events against its tenant's events budget, all keys together
        (``None``: Redis is down)."""
        limit = self._settings.rate_limit_tenant_events
        return await self.hit(f"events:tenant:{tenant}", limit, cost=events)

    async def spend_key_events(self, key_id: str, events: int) -> Verdict | None:
        """Count a batch's events against its key's events budget (``None``: Redis is down)."""
        limit = self._settings.rate_limit_ingest_events
        return await self.hit(f"events:key:{key_id}", limit, cost=events)

    def _remember(self, bucket: str, lease: _Lease) -> None:
        if len(self._leases) >= MAX_LEASES:
            now = time.monotonic()
            self._leases = {b: x for b, x in self._leases.items() if x.ends_at > now}
            self._refills = {b: lock for b, lock in self._refills.items() if b in self._leases}
        self._leases[bucket] = lease

    def _open_circuit(self, exc: Exception) -> None:
        retry_s = self._settings.rate_limit_redis_retry_s
        self._redis_down_until = time.monotonic() + retry_s
        log.warning(
            "rate limiter: Redis unavailable (%s); letting requests through unlimited for %.0fs",
            exc.__class__.__name__,
            retry_s,
        )


async def spend_event_budget(
    limiter: RateLimiter | None, key: str, tenant: str, events: int
) -> None:
    """Count an ingest batch's events against its (already authenticated) key and its
    tenant: a 1,000-event batch is one request but 1,000 events, so batching cannot
    multiply a key's budget, nor more keys a tenant's. Raises a 429 ``rate_limited``
    problem, before anything is stored, over either limit.

    The tenant's budget is asked first: it is the one a busy tenant meets, and a batch it
    refuses then costs the key nothing. (One the key refuses has been counted against the
    tenant: the budgets are windows in Redis, not transactions; it errs on refusing.)"""
    parsed = parse_key(key)
    if limiter is None or parsed is None:
        return
    tenant_verdict = await limiter.spend_tenant_events(tenant, events)
    _refuse_if_over(tenant_verdict, events, "this tenant")
    _refuse_if_over(await limiter.spend_key_events(parsed.key_id, events), events, "this key")


def _refuse_if_over(verdict: Verdict | None, events: int, whose: str) -> None:
    if verdict is not None and not verdict.allowed:
        record_rejection(events, "rate_limited")
        raise rate_limited(
            f"more than {verdict.limit} events in this window for {whose}; retry later",
            verdict.reset_s,
        )


def _key_id(token: str) -> str:
    parsed = parse_key(token)
    assert parsed is not None  # authenticate_cached refused malformed keys already
    return parsed.key_id


def _bearer_token(authorization: str) -> str | None:
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return None


def _header(scope: Scope, name: bytes) -> str:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return ""


async def _send_429(send: Send, verdict: Verdict, scope: Scope) -> None:
    detail = f"more than {verdict.limit} requests in this window; retry later"
    content_type = PROBLEM_JSON
    body = json.dumps(
        {
            "type": "https://fairmeter.dev/problems/rate_limited",
            "title": "Too many requests",
            "status": 429,
            "code": "rate_limited",
            "detail": detail,
            "retry_after_s": verdict.reset_s,
        }
    ).encode()
    if scope["path"] == TRACES_PATH:  # OTLP/HTTP: errors are a google.rpc.Status
        body, content_type = status_body(f"rate_limited: {detail}", _header(scope, b"content-type"))
    headers = [
        (b"content-type", content_type.encode()),
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
        verdict = await limiter.check(_header(scope, b"authorization"), host)
        if verdict is None:
            await app(scope, receive, send)
            return
        if not verdict.allowed:
            await _send_429(send, verdict, scope)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *verdict.headers()]}
            await send(message)

        await app(scope, receive, send_with_headers)

    return middleware


def rate_limit_middleware(limiter: RateLimiter | None) -> Any:
    """The middleware for ``Litestar(middleware=[...])``; one limiter shared by every route
    (``None``: rate limiting is off)."""
    if limiter is None:
        return DefineMiddleware(_passthrough)
    return DefineMiddleware(_middleware, limiter=limiter)


def _passthrough(app: ASGIApp) -> ASGIApp:
    return app
