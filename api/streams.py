"""GET /v1/runs/{run}/stream and GET /v1/customers/{customer}/stream — live status as
Server-Sent Events (issue #16).

A stream is opened in three steps, in this order: its inbox joins the process's fan-out
(``api/stream_hub.py``) *first*, then it reads what it missed from the notifications table
(everything after ``Last-Event-ID``, or what committed since its snapshot), then it sends
what the fan-out brings. A notification committed at any moment is therefore in the table
read, in the inbox, or both — never neither — and the stream's cursor sends it once (what
that takes when ids and commits disagree: metering/notifications/cursor.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Annotated, Any

import msgspec
import psycopg
from anyio import to_thread
from litestar import Request, get
from litestar.datastructures import State
from litestar.params import FromPath, HeaderParameter, QueryParameter
from litestar.response import Stream

from api.metrics import STREAM_CATCH_UPS
from api.openapi_docs import AUTHENTICATED, keys, problems
from api.runs import run_reply
from api.services import Services
from api.stream_hub import Inbox
from api.wire import StreamEvent
from metering.db import raw_transaction
from metering.keys import Principal, Scope
from metering.notifications import SCHEMA_VERSION
from metering.notifications.cursor import StreamCursor
from metering.notifications.replay import PAGE, StoredNotification, StreamScope, after
from metering.streams import (
    RUN_STATUS,
    STREAM_OPENED,
    Resume,
    StreamStart,
    open_customer_stream,
    open_run_stream,
    resume_position,
)

log = logging.getLogger("fairmeter.streams")

# The scopes of the reads each stream stands for: GET /v1/runs/{run}, and the statements.
RUN_SCOPES = (Scope.INGEST, Scope.SUPPORT, Scope.ADMIN, Scope.CUSTOMER)
CUSTOMER_SCOPES = (Scope.CUSTOMER, Scope.SUPPORT, Scope.ADMIN)
EVENT_STREAM = "text/event-stream"
KEEP_ALIVE = b": keep-alive\n\n"
# After a failed read from the table, try again this soon (heartbeats go on meanwhile).
CATCH_UP_RETRY_S = 1.0

STREAM_DESCRIPTION = (
    "Server-Sent Events: `id:` a resume token for Last-Event-ID, `event:` the type, `data:` JSON "
    "{type, id, run, customer, created_at, schema_version, data}; `: keep-alive` comments "
    "in between (docs/events.md)"
)

LastEventIdHeader = Annotated[
    str | None,
    HeaderParameter(
        name="Last-Event-ID",
        required=False,
        description="Resume after the event with this id (its resume token): every "
        "notification the client has not had is sent, once.",
    ),
]
LastEventIdQuery = Annotated[
    str | None,
    QueryParameter(
        name="last_event_id",
        required=False,
        description="The same as the Last-Event-ID header, for clients that cannot set one.",
    ),
]


@get(
    "/v1/runs/{run:str}/stream",
    summary="Follow a run's status live (Server-Sent Events)",
    tags=["runs"],
    security=keys(*RUN_SCOPES),
    responses=problems(*AUTHENTICATED, 404, 422),
    media_type=EVENT_STREAM,
    response_description=STREAM_DESCRIPTION,
)
async def stream_run(
    request: Request[Any, Any, Any],
    run: FromPath[str],
    state: State,
    last_event_id_header: LastEventIdHeader = None,
    last_event_id: LastEventIdQuery = None,
) -> Stream:
    """A ``run.status`` snapshot first (on a fresh stream), then every notification about
    the run as it commits, each with its id; ``Last-Event-ID`` resumes without loss."""
    services: Services = state.services
    principal = await _authenticate(services, request, RUN_SCOPES)
    resume = resume_position(last_event_id_header, last_event_id)
    start = await to_thread.run_sync(_open, services, open_run_stream, principal, run, resume)
    return _respond(services, start, principal)


@get(
    "/v1/customers/{customer:str}/stream",
    summary="Follow every run of a customer live (Server-Sent Events)",
    tags=["runs"],
    security=keys(*CUSTOMER_SCOPES),
    responses=problems(*AUTHENTICATED, 404, 422),
    media_type=EVENT_STREAM,
    response_description=STREAM_DESCRIPTION,
)
async def stream_customer(
    request: Request[Any, Any, Any],
    customer: FromPath[str],
    state: State,
    last_event_id_header: LastEventIdHeader = None,
    last_event_id: LastEventIdQuery = None,
) -> Stream:
    """A ``stream.opened`` event (on a fresh stream), then every notification about the
    customer and its runs as it commits; ``Last-Event-ID`` resumes without loss."""
    services: Services = state.services
    # Ingest keys pass here and are refused by the statements' rule, with its 403.
    principal = await _authenticate(services, request, (*CUSTOMER_SCOPES, Scope.INGEST))
    resume = resume_position(last_event_id_header, last_event_id)
    start = await to_thread.run_sync(
        _open, services, open_customer_stream, principal, customer, resume
    )
    return _respond(services, start, principal)


STREAM_HANDLERS = [stream_run, stream_customer]


async def _authenticate(
    services: Services, request: Request[Any, Any, Any], scopes: tuple[Scope, ...]
) -> Principal:
    principal = services.authenticate_cached(request, *scopes)
    if principal is None:
        principal = await to_thread.run_sync(services.authenticate, request, *scopes)
    return principal


OpenStream = Callable[[psycopg.Connection[Any], Principal, str, Resume | None], StreamStart]


def _open(
    services: Services,
    use_case: OpenStream,
    principal: Principal,
    target: str,
    resume: Resume | None,
) -> StreamStart:
    with raw_transaction(services.engine) as conn:
        return use_case(conn, principal, target, resume)


def _respond(services: Services, start: StreamStart, principal: Principal) -> Stream:
    # Before any read (see the module); refused when the key's, the tenant's or the
    # process's share of streams is full (api/stream_hub.py).
    inbox = services.streams.subscribe(start.scope, principal.key_id)
    return Stream(
        _events(services, start, inbox),
        media_type=EVENT_STREAM,
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _events(services: Services, start: StreamStart, inbox: Inbox) -> AsyncIterator[bytes]:
    """The stream's body, until the client goes or ``stream_max_s`` passes; the inbox leaves
    the fan-out however it ends."""
    settings = services.settings
    cursor = StreamCursor(start.position, sent=start.sent)
    ends_at = time.monotonic() + settings.stream_max_s
    try:
        yield _opening(start, settings.stream_retry_ms)
        quiet_since = time.monotonic()
        behind = True  # the first read is always the table's
        failing = False
        if start.resumed:
            STREAM_CATCH_UPS.inc()
        while (left := ends_at - time.monotonic()) > 0:
            if behind:
                try:
                    async for chunk in _catch_up(services, start.scope, cursor):
                        quiet_since = time.monotonic()
                        yield chunk
                    behind = failing = False
                except Exception as exc:  # the database is away: keep the client, retry
                    if not failing:
                        log.warning("stream catch-up failed, retrying every second: %r", exc)
                    failing = True
            wait = min(left, settings.stream_heartbeat_s - (time.monotonic() - quiet_since))
            if behind:
                wait = min(wait, CATCH_UP_RETRY_S)
            if await inbox.wait(max(wait, 0.0)):
                rows, fell_behind = inbox.take()
                if fell_behind:
                    STREAM_CATCH_UPS.inc()
                behind = behind or fell_behind
                for row, token in cursor.take(rows):
                    quiet_since = time.monotonic()
                    yield _frame(row, token)
            elif time.monotonic() - quiet_since >= settings.stream_heartbeat_s:
                quiet_since = time.monotonic()
                yield KEEP_ALIVE
    finally:
        services.streams.unsubscribe(inbox)


async def _catch_up(
    services: Services, scope: StreamScope, cursor: StreamCursor
) -> AsyncIterator[bytes]:
    """Frames for what the table holds after what the stream has sent, page by page."""
    after_id = cursor.horizon
    while True:
        rows = await to_thread.run_sync(_after, services, scope, after_id)
        for row, token in cursor.take(rows):
            yield _frame(row, token)
        if len(rows) < PAGE:
            return
        after_id = rows[-1].id


def _after(services: Services, scope: StreamScope, after_id: int) -> list[StoredNotification]:
    with raw_transaction(services.engine) as conn:
        return after(conn, scope, after_id)


def _opening(start: StreamStart, retry_ms: int) -> bytes:
    """The first frame: the reconnection delay, and on a fresh stream its first event, whose
    id is where a reconnecting client resumes from."""
    retry = f"retry: {retry_ms}\n".encode()
    if start.resumed:
        return retry + b"\n"
    scope = start.scope
    event = StreamEvent(
        type=RUN_STATUS if start.run is not None else STREAM_OPENED,
        id=start.position,
        run=scope.subject,
        customer=scope.customer_id,
        created_at=datetime.now(UTC),
        schema_version=SCHEMA_VERSION,
        data=run_reply(start.run) if start.run is not None else {},
    )
    return retry + _encode(event, str(start.position))


def _frame(row: StoredNotification, token: str) -> bytes:
    event = StreamEvent(
        type=row.type,
        id=row.id,
        run=row.subject,
        customer=row.customer_id,
        created_at=row.created_at,
        schema_version=str(row.data.get("schema_version", SCHEMA_VERSION)),
        data=row.data,
    )
    return _encode(event, token)


def _encode(event: StreamEvent, token: str) -> bytes:
    """One event. Its ``id:`` is the resume token after it (the notification's own id is in
    the data): a client that comes back with it as ``Last-Event-ID`` misses nothing, not even
    a notification that committed after a higher-numbered one while it was away. JSON holds
    no raw line break, so ``data:`` is one line."""
    head = f"id: {token}\nevent: {event.type}\ndata: "
    return head.encode() + msgspec.json.encode(event) + b"\n\n"
