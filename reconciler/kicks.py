"""Kicks: a task sent at once after a commit that made work for it, at most one waiting.

Settlement kicks the fan-out after its commit, the fan-out kicks delivery; at hundreds of
commits a second, one message per commit filled the queue with redundant kicks, each
taking a worker process in turn while the settlements behind them waited. A kick is sent
only when none of that task is waiting: ``SET NX`` of a flag in Redis, with the kick's own
expiry, that the task clears as it starts (so a commit made while it runs kicks it again,
and none is missed). A kick lost with a killed worker leaves the flag until it expires;
beat runs every such task each second meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable

import redis

# A kick still queued this long after it was sent is stale: beat has done its work since.
KICK_EXPIRES_S = 30
PREFIX = "fairmeter:kick:"


def kick_once(client: redis.Redis, name: str, send: Callable[[float], object]) -> bool:
    """Send task ``name`` (``send(expires_s)``) unless a kick of it is already waiting;
    whether one was sent."""
    if not client.set(PREFIX + name, "1", nx=True, ex=KICK_EXPIRES_S):
        return False
    send(KICK_EXPIRES_S)
    return True


def started(client: redis.Redis, name: str) -> None:
    """The task ``name`` runs: the next kick is sent again."""
    client.delete(PREFIX + name)
