"""Stable event ids: the same reported fact always gets the same CloudEvents ``id``.

The server deduplicates on ``(source, id)``, so a retried call (a crashed worker that
reports step 3 again, a request repeated after a timeout) must produce the id it produced
the first time. The id is therefore not random but a hash of the event's *natural key*::

    id = "fm1-" + sha256(json(["fairmeter-event-id/1", run, type, attempt, key]))[:32 hex]

where ``key`` is a JSON object (sorted keys, ``None`` values left out) of the fields that
tell two events of one type and attempt apart:

========================  ===========================================================
type                      natural key (besides run, type, attempt)
========================  ===========================================================
``run.started``           —
``run.usage``             ``step``, ``tool_call_id``, ``replay``
``run.checkpoint``        ``checkpoint_id``
``run.delivered``         ``step``, ``kind``
``run.tool_call``         ``step``, ``tool_call_id``, ``status``
``run.resumed``           — (the attempt it starts is the key)
``run.completed`` …       — (also ``run.cancelled``, ``run.failed``)
``run.heartbeat``         ``seq``
``connection.lost`` /     ``side``, ``seq``
``connection.restored``
========================  ===========================================================

``seq`` is a per-(source, run, type) counter kept in the spool, so it survives restarts:
these types have no natural key (two heartbeats look alike), so a repeated call gets a new
id. They carry no money; to make a connection event idempotent anyway, pass ``key=`` (the
disconnect's own id, say), which replaces ``seq``.

Every event method takes ``key=``: a caller-chosen discriminator added to the natural key
(and used instead of ``seq``), e.g. when one step makes two model calls. 128 bits of
SHA-256 make accidental collisions between different keys negligible.

The content (everything but ``id`` and ``time``) is hashed separately: reporting the same
natural key again with *different* content is a programming error the spool refuses at
call time (:class:`~fairmeter_client.errors.EventConflictError`) rather than a 409 later.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

ID_PREFIX = "fm1-"
ID_SCHEME = "fairmeter-event-id/1"


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def event_id(run: str, event_type: str, attempt: int, key: Mapping[str, Any]) -> str:
    """The deterministic id of one event (see the module docstring for the scheme)."""
    natural = {name: value for name, value in key.items() if value is not None}
    digest = hashlib.sha256(_canonical([ID_SCHEME, run, event_type, attempt, natural]))
    return ID_PREFIX + digest.hexdigest()[:32]


def content_hash(event: Mapping[str, Any]) -> str:
    """SHA-256 of what the event says, leaving out ``id`` and ``time`` (when it was said)."""
    content = {name: value for name, value in event.items() if name not in ("id", "time")}
    return hashlib.sha256(_canonical(content)).hexdigest()
