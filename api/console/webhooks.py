"""The console's webhook pages (admin keys): the tenant's endpoints, one endpoint's delivery
log, and redelivery of one message or of everything since a time.

Each handler calls the same use cases as ``/v1/webhooks`` (``metering.webhooks``), so the
console and the API can never disagree about who may see an endpoint or what redelivery
does. Support keys are refused by those use cases (a 403 page) and see no nav entry.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from litestar import Request, Response, get, post
from litestar.datastructures import State
from litestar.params import FromPath, FromQuery

from api.console.pages import page_response
from api.console.web import (
    Console,
    Form,
    check_csrf,
    error_message,
    redirect_with_flash,
    services_of,
    signed_in,
)
from api.services import Services
from metering.db import raw_transaction
from metering.errors import FieldError, MeteringError, validation_error
from metering.webhooks import endpoints, log

PAGE_SIZE = 50


def endpoint_path(endpoint_id: str) -> str:
    return f"/console/webhooks/{quote(endpoint_id, safe='')}"


def since_from(text: str | None) -> datetime:
    """The "Redeliver since…" field: a ``datetime-local`` value read as UTC (the form says
    so), or an ISO time with its own zone; anything else is a 422 naming the field."""
    try:
        moment = datetime.fromisoformat((text or "").strip())
    except ValueError:
        raise validation_error(
            [FieldError("since", "invalid_time", "enter a time, e.g. 2026-12-01 09:30 (UTC)")],
            detail="enter a time, e.g. 2026-12-01 09:30 (UTC)",
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


@get("/webhooks", sync_to_thread=True)
def endpoints_page(request: Request[Any, Any, Any], state: State) -> Response[str]:
    services = services_of(state)
    console = signed_in(request, services)
    with raw_transaction(services.engine) as conn:
        found = endpoints.list_endpoints(conn, console.principal)
    return page_response(request, "webhooks.html", console, nav="webhooks", endpoints=found)


def _endpoint_page(
    request: Request[Any, Any, Any],
    console: Console,
    services: Services,
    endpoint_id: str,
    *,
    cursor: str | None = None,
    status: int = 200,
    flash: dict[str, str] | None = None,
    since: str = "",
) -> Response[str]:
    with raw_transaction(services.engine) as conn:
        endpoint = endpoints.get_endpoint(conn, console.principal, endpoint_id)
        page = log.deliveries(conn, console.principal, endpoint_id, cursor=cursor, limit=PAGE_SIZE)
    response = page_response(
        request,
        "webhook_endpoint.html",
        console,
        nav="webhooks",
        flash=flash,
        endpoint=endpoint,
        page=page,
        since=since,
        path=endpoint_path(endpoint_id),
        now=datetime.now(UTC),
    )
    response.status_code = status
    return response


@get("/webhooks/{endpoint_id:str}", sync_to_thread=True)
def endpoint_page(
    request: Request[Any, Any, Any],
    state: State,
    endpoint_id: FromPath[str],
    cursor: FromQuery[str | None] = None,
) -> Response[str]:
    services = services_of(state)
    console = signed_in(request, services)
    return _endpoint_page(request, console, services, endpoint_id, cursor=cursor)


def _refused(
    request: Request[Any, Any, Any],
    console: Console,
    services: Services,
    endpoint_id: str,
    exc: MeteringError,
    since: str = "",
) -> Response[str]:
    """The endpoint page again with what went wrong (a missing endpoint → the 404 page)."""
    flash = {"level": "error", "text": f"Nothing was sent again. {error_message(exc)}."}
    return _endpoint_page(
        request, console, services, endpoint_id, status=exc.status, flash=flash, since=since
    )


@post(
    "/webhooks/{endpoint_id:str}/messages/{message_id:str}/redeliver",
    sync_to_thread=True,
    status_code=200,
)
def redeliver_message(
    request: Request[Any, Any, Any],
    state: State,
    endpoint_id: FromPath[str],
    message_id: FromPath[str],
    data: Form,
) -> Response[Any]:
    services = services_of(state)
    console = signed_in(request, services)
    check_csrf(console, services, data)
    try:
        with raw_transaction(services.engine) as conn:
            log.redeliver_message(conn, console.principal, message_id, datetime.now(UTC))
    except MeteringError as exc:
        return _refused(request, console, services, endpoint_id, exc)
    return redirect_with_flash(
        request,
        endpoint_path(endpoint_id),
        f"Message {message_id} queued again: it is sent at once with the same webhook-id and body.",
    )


@post("/webhooks/{endpoint_id:str}/redeliver", sync_to_thread=True, status_code=200)
def redeliver_since(
    request: Request[Any, Any, Any], state: State, endpoint_id: FromPath[str], data: Form
) -> Response[Any]:
    services = services_of(state)
    console = signed_in(request, services)
    check_csrf(console, services, data)
    typed = data.get("since", "")
    try:
        since = since_from(typed)
        with raw_transaction(services.engine) as conn:
            count = log.redeliver_since(
                conn, console.principal, endpoint_id, since, datetime.now(UTC)
            )
    except MeteringError as exc:
        return _refused(request, console, services, endpoint_id, exc, since=typed)
    noun = "message" if count == 1 else "messages"
    return redirect_with_flash(
        request,
        endpoint_path(endpoint_id),
        f"{count} {noun} since {since.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC queued again.",
    )
