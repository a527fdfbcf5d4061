"""One database engine per worker process, created after the fork."""

from __future__ import annotations

import os

from sqlalchemy.engine import Engine

from metering.config import Settings, load_settings
from metering.db import create_db_engine

_engines: dict[int, Engine] = {}


def settings() -> Settings:
    return load_settings()


def engine() -> Engine:
    """Pooled connections must never cross a fork, so the engine is keyed by process id."""
    pid = os.getpid()
    if pid not in _engines:
        _engines[pid] = create_db_engine(settings())
    return _engines[pid]
