"""Per-tenant slots for heavy requests, shared by every API process through Redis.

A slot is a member of a sorted set per (kind, tenant), scored by the moment its lease ends:
taking one first drops the leases that ended (a process that crashed holding a slot leaks it
for one lease at most), then adds a member when fewer than the limit are left; giving it
back removes the member. Both are one Lua script or one command, so two processes never
take the last slot together. No library in the lock file offers a counting semaphore with
leases (redis-py's ``Lock`` is a mutex), and the script is a dozen lines.

The slots fail open, like the rate limiter (api/ratelimit.py): when Redis cannot be reached
a heavy request goes ahead uncapped and a warning is logged. An OTLP export is ingest, which
must not go down with Redis; a what-if is a read, and both stay bounded in PostgreSQL by
their statement timeouts (metering/db.py) whatever Redis does.
"""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Final

import anyio
import redis
from redis.asyncio import Redis

from metering.errors import MeteringError

log = logging.getLogger("fairmeter.tenant_slots")

# When the slots are full the client may try again this soon: heavy requests usually end
# well before their lease does, and a refused try costs one Redis call.
RETRY_AFTER_S: Final = 1

# KEYS[1]: the slots; ARGV: token, limit, lease (ms). {1, 0} taken; {0, ms} full, the first
# lease ending in ms. The key lives as long as its newest lease.
_TAKE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {1, 0}
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {0, tonumber(first[2]) - now}
"""


@dataclass(frozen=True)
class SlotKind:
    """A kind of heavy request: its slots per tenant, how long a slot is leased (longer than
    such a request may run), and what a refusal says."""

    name: str
    prefix: str  # of the Redis keys (config.py: heavy_slots_redis_prefix)
    per_tenant: int
    lease_s: float
    code: str
    what: str


@asynccontextmanager
async def tenant_slot(client: Redis, kind: SlotKind, tenant: str) -> AsyncIterator[None]:
    """One of ``tenant``'s slots of ``kind`` while the block runs; 429 when all are taken."""
    key = f"{kind.prefix}:{kind.name}:{tenant}"
    token = uuid.uuid4().hex
    taken = await _take(client, key, token, kind)
    try:
        yield
    finally:
        if taken:
            with anyio.CancelScope(shield=True):
                await _give_back(client, key, token)


async def _take(client: Redis, key: str, token: str, kind: SlotKind) -> bool:
    """Whether a slot was taken (``False``: Redis is unreachable, the request goes ahead)."""
    lease_ms = math.ceil(kind.lease_s * 1000)
    try:
        taken, _ = await client.eval(_TAKE, 1, key, token, kind.per_tenant, lease_ms)
    except (redis.RedisError, OSError) as error:
        log.warning("tenant slots unavailable, %s goes ahead uncapped: %s", kind.name, error)
        return False
    if not taken:
        raise too_many_concurrent(kind)
    return True


async def _give_back(client: Redis, key: str, token: str) -> None:
    try:
        await client.zrem(key, token)
    except (redis.RedisError, OSError) as error:  # the lease ends it
        log.warning("tenant slot not given back (its lease ends it): %s", error)


def too_many_concurrent(kind: SlotKind) -> MeteringError:
    """429: the tenant already runs as many requests of ``kind`` as it may."""
    what = kind.what.removesuffix("s") if kind.per_tenant == 1 else kind.what
    return MeteringError(
        f"at most {kind.per_tenant} {what} at a time per tenant; retry when one has finished",
        code=kind.code,
        status=429,
        title="Too many requests",
        extra={"retry_after_s": RETRY_AFTER_S, "limit": kind.per_tenant},
    )
