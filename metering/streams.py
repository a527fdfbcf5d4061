"""Opening a live status stream: who may follow which run or customer, and where it starts.

The rules are those of the reads the stream stands for, imported, not restated: a run's
stream follows ``GET /v1/runs/{run}`` (every scope of the tenant, a customer key only its
own customer's runs, anything else 404), a customer's stream follows the statements
(customer keys their own customer, support and admin every customer, ingest keys 403).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from metering.errors import FieldError, MeteringError, validation_error
from metering.ids import IdKind, lookup_problem
from metering.keys import Principal
from metering.notifications.cursor import InvalidToken, parse_token
from metering.notifications.replay import StreamScope, latest_id
from metering.runs import RunView, find_run, get_run_view
from metering.statements.service import authorize

# The first event of a fresh stream, besides the notification types: a run's stream opens
# with the run as it is now, a customer's with the position it starts from.
RUN_STATUS = "run.status"
STREAM_OPENED = "stream.opened"


@dataclass(frozen=True, slots=True)
class StreamStart:
    """A stream the principal may open: what it follows and where it starts.

    ``position`` is the id after which notifications are sent: the floor of the client's
    ``Last-Event-ID`` when it resumes (and ``sent``, the ids above it the client already
    has), else the latest notification the snapshot (``run``) already reflects.
    """

    scope: StreamScope
    position: int
    resumed: bool
    run: RunView | None = None  # a fresh run stream's snapshot
    sent: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Resume:
    """A resume token, read: everything at or below ``floor`` and the ``sent`` ids above it
    reached the client (metering/notifications/cursor.py)."""

    floor: int
    sent: tuple[int, ...] = ()


def resume_position(header: str | None, query: str | None) -> Resume | None:
    """Where a client resumes: the ``Last-Event-ID`` header, else the ``last_event_id``
    query parameter (for EventSource polyfills that cannot set headers); ``None`` for a
    fresh stream. 422 for anything but an id this server hands out (a resume token, or a
    plain non-negative integer)."""
    given = header if header is not None and header.strip() else query
    if given is None or not given.strip():
        return None
    try:
        floor, sent = parse_token(given)
    except InvalidToken:
        raise _invalid(
            "$.last_event_id",
            "invalid_last_event_id",
            "Last-Event-ID is the id: of an event this stream sent, as it was sent",
        ) from None
    return Resume(floor, tuple(sent))


def _check(value: str, kind: IdKind) -> None:
    problem = lookup_problem(value, kind)
    if problem is not None:
        raise _invalid(f"$.{kind.noun}", "invalid_id", problem)


def _invalid(path: str, code: str, message: str) -> MeteringError:
    error = validation_error([FieldError(path, code, message)], detail=f"{path}: {message}")
    error.title = "Invalid request"
    return error


def open_run_stream(
    conn: psycopg.Connection[Any], principal: Principal, subject: str, resume: Resume | None
) -> StreamStart:
    """A run's stream, authorized as ``GET /v1/runs/{run}`` is (404 when not visible); a
    fresh one carries the run as it is now."""
    _check(subject, IdKind.RUN)
    run_id, customer = find_run(conn, principal, subject)
    scope = StreamScope(principal.tenant_id, customer, run_id=run_id, subject=subject)
    if resume is not None:
        return StreamStart(scope, resume.floor, resumed=True, sent=resume.sent)
    # The latest id is read before the run: a change committed in between is then both in
    # the snapshot and sent again (harmless), rather than in neither.
    position = latest_id(conn, scope)
    return StreamStart(scope, position, resumed=False, run=get_run_view(conn, principal, subject))


def open_customer_stream(
    conn: psycopg.Connection[Any], principal: Principal, customer: str, resume: Resume | None
) -> StreamStart:
    """A customer's stream, authorized as its statements are."""
    _check(customer, IdKind.CUSTOMER)
    authorize(conn, principal, customer)
    scope = StreamScope(principal.tenant_id, customer)
    if resume is not None:
        return StreamStart(scope, resume.floor, resumed=True, sent=resume.sent)
    return StreamStart(scope, latest_id(conn, scope), resumed=False)
