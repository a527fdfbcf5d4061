"""Following a run's live status, as an agent's UI would show it: the server's Server-Sent
Events stream, read with httpx, resumed with ``Last-Event-ID`` after every drop.

::

    from fairmeter_client import follow_run

    for event in follow_run("https://fairmeter.example.com", customer_key, "run-42"):
        print(event.type, event.data.get("status"))
        if event.type == "run.settled":
            break

A dropped connection, a server restart, a proxy that closes idle connections, or the server
ending a stream after its maximum time are all the same to the caller: the iterator
reconnects (waiting the server's ``retry:`` hint, longer with jittered backoff while it
keeps failing) and continues after the last event it yielded, so no event is lost or
repeated. It stops only when the caller stops iterating, or with
:class:`~fairmeter_client.errors.StreamRefusedError` when the server refuses the stream.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx

from fairmeter_client.errors import StreamRefusedError
from fairmeter_client.transport import USER_AGENT, Backoff, retry_after_s

# Statuses worth retrying; any other refusal is final.
RETRYABLE = frozenset({408, 425, 429, 500, 502, 503, 504})
DEFAULT_RETRY_S = 2.0


@dataclass(frozen=True, slots=True)
class StatusEvent:
    """One event of a status stream: a notification (``type`` is one of docs/events.md's,
    ``data`` its fields), or the stream's opening ``run.status`` (``data`` is the run as
    ``GET /v1/runs/{run}`` returns it) or ``stream.opened``."""

    type: str
    id: int
    run: str | None
    customer: str
    created_at: str
    data: dict[str, Any] = field(default_factory=dict)
    schema_version: str = ""
    # Where to resume after this event (the SSE ``id:``): pass it back as ``last_event_id``
    # to pick up later, even in another process. Opaque; not ``id``, which is the
    # notification's and misses one that committed late.
    resume_token: str | None = None


@dataclass(slots=True)
class Message:
    """One Server-Sent Events message as the WHATWG parsing rules assemble it."""

    event: str = "message"
    data: str = ""
    id: str | None = None  # the last event id in force after this message
    retry_ms: int | None = None


def parse(lines: Iterable[str]) -> Iterator[Message]:
    """Messages from the stream's lines (``\\n``, ``\\r\\n`` or ``\\r`` already split off):
    comments skipped, ``data`` lines joined, the last ``id`` carried over (HTML Living
    Standard, "Server-sent events", event stream interpretation)."""
    last_id: str | None = None
    message = Message()
    data: list[str] = []
    fields = 0  # in the message so far: one made of comments alone is no message
    for line in lines:
        if not line:
            if fields:
                message.data, message.id = "\n".join(data), last_id
                yield message
            message, data, fields = Message(), [], 0
        elif not line.startswith(":"):
            fields += 1
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "data":
                data.append(value)
            elif name == "event":
                message.event = value or "message"
            elif name == "id" and "\x00" not in value:
                last_id = value
            elif name == "retry" and value.isascii() and value.isdigit():
                message.retry_ms = int(value)


def follow_run(
    base_url: str,
    api_key: str,
    run: str,
    *,
    last_event_id: int | str | None = None,
    read_timeout_s: float = 60.0,
    max_backoff_s: float = 30.0,
    http_client: httpx.Client | None = None,
) -> Iterator[StatusEvent]:
    """The status events of ``run``, live, for as long as the caller iterates.

    ``api_key`` is any key that may read the run (an agent's UI holds a ``customer`` key).
    ``last_event_id`` (an event's ``resume_token``) resumes after that event instead of
    opening fresh (a fresh stream starts with a ``run.status`` event: the run as it is
    now). ``read_timeout_s``: reconnect when the server sends nothing, heartbeats included,
    for this long. ``http_client``: an
    ``httpx.Client`` to use (its timeouts apply) instead of one of our own.
    """
    url = f"{base_url.rstrip('/')}/v1/runs/{quote(run, safe='')}/stream"
    client = http_client or httpx.Client(timeout=httpx.Timeout(10.0, read=read_timeout_s))
    return _follow(client, url, api_key, last_event_id, max_backoff_s, own=http_client is None)


def follow_customer(
    base_url: str,
    api_key: str,
    customer: str,
    *,
    last_event_id: int | str | None = None,
    read_timeout_s: float = 60.0,
    max_backoff_s: float = 30.0,
    http_client: httpx.Client | None = None,
) -> Iterator[StatusEvent]:
    """Every status event of ``customer``'s runs, live (a fresh stream starts with a
    ``stream.opened`` event); the options are :func:`follow_run`'s."""
    url = f"{base_url.rstrip('/')}/v1/customers/{quote(customer, safe='')}/stream"
    client = http_client or httpx.Client(timeout=httpx.Timeout(10.0, read=read_timeout_s))
    return _follow(client, url, api_key, last_event_id, max_backoff_s, own=http_client is None)


def _follow(
    client: httpx.Client,
    url: str,
    api_key: str,
    last_event_id: int | str | None,
    max_backoff_s: float,
    *,
    own: bool,
) -> Iterator[StatusEvent]:
    position = None if last_event_id is None else str(last_event_id)
    hint_s = DEFAULT_RETRY_S
    backoff = Backoff(hint_s, max_backoff_s)
    try:
        while True:
            retry_after: float | None = None
            try:
                with client.stream("GET", url, headers=_headers(api_key, position)) as reply:
                    if reply.status_code != 200:
                        retry_after = _refused(reply)
                    else:
                        for message in parse(reply.iter_lines()):
                            backoff.reset()  # the stream works: a later drop starts afresh
                            if message.retry_ms is not None:
                                hint_s = message.retry_ms / 1000
                            position = message.id or position
                            event = _event(message)
                            if event is not None:
                                yield event
            except httpx.HTTPError:
                pass  # dropped, timed out, or the server is away: reconnect below
            backoff.base_s = hint_s
            time.sleep(backoff.next_delay(retry_after))
    finally:
        if own:
            client.close()


def _headers(api_key: str, position: str | None) -> dict[str, str]:
    headers = {
        "Authorization": f"Bearer {api_key}",
        "Accept": "text/event-stream",
        "Cache-Control": "no-cache",
        "User-Agent": USER_AGENT,
    }
    if position is not None:
        headers["Last-Event-ID"] = position
    return headers


def _refused(reply: httpx.Response) -> float | None:
    """The Retry-After of a refusal worth retrying; raises for any other."""
    reply.read()
    if reply.status_code in RETRYABLE:
        return retry_after_s(reply.headers.get("retry-after"))
    try:
        problem = reply.json()
    except ValueError:
        problem = {}
    if not isinstance(problem, dict):
        problem = {}
    raise StreamRefusedError(
        reply.status_code,
        str(problem.get("code", f"http_{reply.status_code}")),
        str(problem.get("detail", reply.text[:300])),
    )


def _event(message: Message) -> StatusEvent | None:
    """The message as a status event; ``None`` for one without data or not of this API."""
    try:
        body = json.loads(message.data) if message.data else None
        if not isinstance(body, dict):
            return None
        return StatusEvent(
            type=str(body.get("type", message.event)),
            id=int(body["id"]),
            run=body.get("run"),
            customer=str(body.get("customer", "")),
            created_at=str(body.get("created_at", "")),
            data=dict(body.get("data") or {}),
            schema_version=str(body.get("schema_version", "")),
            resume_token=message.id,
        )
    except (ValueError, KeyError, TypeError):
        return None
