"""What handlers need, built once per process from the settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis
from litestar import Request
from redis.asyncio import Redis as AsyncRedis
from sqlalchemy.engine import Engine

from api.auth import KeyStore, bearer_key, require_scope
from api.ingest_group import GroupCommitter
from api.ratelimit import RateLimiter
from api.stream_hub import StreamHub
from metering.config import Settings
from metering.db import create_db_engine, raw_transaction
from metering.keys import Principal, Scope
from metering.prices import CatalogCache, load_catalog


@dataclass
class Services:
    settings: Settings
    engine: Engine
    keys: KeyStore
    catalogs: CatalogCache
    redis: redis.Redis
    redis_async: AsyncRedis  # for the rate limiter, on the event loop
    ingest_group: GroupCommitter | None  # None: one transaction per request
    limiter: RateLimiter | None  # None: rate limits are off
    streams: StreamHub  # live status streams: the process's LISTEN connection and inboxes

    @classmethod
    def build(cls, settings: Settings) -> Services:
        engine = create_db_engine(settings)

        def load() -> Any:
            with raw_transaction(engine) as conn:
                return load_catalog(conn)

        keys = KeyStore(
            engine, settings.key_pepper, settings.key_cache_ttl_s, settings.key_cache_max_ids
        )
        redis_async = AsyncRedis.from_url(
            settings.redis_url, socket_timeout=2, socket_connect_timeout=2
        )
        return cls(
            settings=settings,
            engine=engine,
            keys=keys,
            catalogs=CatalogCache(load),
            redis=redis.Redis.from_url(
                settings.redis_url, socket_timeout=2, socket_connect_timeout=2
            ),
            redis_async=redis_async,
            ingest_group=GroupCommitter(
                engine,
                max_events=settings.ingest_group_max_events,
                max_flushes=settings.ingest_group_flushes,
            )
            if settings.ingest_group_commit
            else None,
            limiter=RateLimiter(redis_async, keys, settings)
            if settings.rate_limit_enabled
            else None,
            streams=StreamHub(settings, engine),
        )

    def authenticate(self, request: Request[Any, Any, Any], *scopes: Scope) -> Principal:
        principal = self.keys.authenticate(bearer_key(request))
        return require_scope(principal, *scopes)

    def authenticate_cached(
        self, request: Request[Any, Any, Any], *scopes: Scope
    ) -> Principal | None:
        """``authenticate`` from the key cache alone: ``None`` when the database is needed."""
        principal = self.keys.authenticate_cached(bearer_key(request))
        return None if principal is None else require_scope(principal, *scopes)

    async def close(self) -> None:
        await self.streams.close()
        self.engine.dispose()
        self.redis.close()
        await self.redis_async.aclose()
