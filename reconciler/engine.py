"""Per-process resources for tasks, created after the fork."""

from __future__ import annotations

import os

import redis
from sqlalchemy.engine import Engine

from metering.billing.push import Pusher
from metering.config import Settings, load_settings
from metering.db import create_db_engine
from reconciler.webhook_sender import WebhookSender

_engines: dict[int, Engine] = {}
_pushers: dict[int, Pusher] = {}
_senders: dict[int, WebhookSender] = {}
_redis: dict[int, redis.Redis] = {}


def settings() -> Settings:
    return load_settings()


def engine() -> Engine:
    """Pooled connections must never cross a fork, so the engine is keyed by process id."""
    pid = os.getpid()
    if pid not in _engines:
        _engines[pid] = create_db_engine(settings())
    return _engines[pid]


def pusher() -> Pusher:
    pid = os.getpid()
    if pid not in _pushers:
        _pushers[pid] = Pusher(engine(), settings())
    return _pushers[pid]


def webhook_sender() -> WebhookSender:
    """An HTTP client (and its connection pool) per process, like the engine."""
    pid = os.getpid()
    if pid not in _senders:
        _senders[pid] = WebhookSender()
    return _senders[pid]


def redis_client() -> redis.Redis:
    """The broker's Redis, for the kicks' flags; a client per process, like the engine."""
    pid = os.getpid()
    if pid not in _redis:
        _redis[pid] = redis.Redis.from_url(settings().redis_url)
    return _redis[pid]
