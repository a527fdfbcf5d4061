"""What handlers need, built once per process from the settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis
from litestar import Request
from sqlalchemy.engine import Engine

from api.auth import KeyStore, bearer_key, require_scope
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

    @classmethod
    def build(cls, settings: Settings) -> Services:
        engine = create_db_engine(settings)

        def load() -> Any:
            with raw_transaction(engine) as conn:
                return load_catalog(conn)

        return cls(
            settings=settings,
            engine=engine,
            keys=KeyStore(engine, settings.key_pepper, settings.key_cache_ttl_s),
            catalogs=CatalogCache(load),
            redis=redis.Redis.from_url(
                settings.redis_url, socket_timeout=2, socket_connect_timeout=2
            ),
        )

    def authenticate(self, request: Request[Any, Any, Any], *scopes: Scope) -> Principal:
        principal = self.keys.authenticate(bearer_key(request))
        return require_scope(principal, *scopes)

    def close(self) -> None:
        self.engine.dispose()
        self.redis.close()
