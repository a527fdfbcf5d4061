"""Every error leaves the API as ``application/problem+json`` with a stable ``code``."""

from __future__ import annotations

import logging
from typing import Any

import psycopg
import sqlalchemy.exc
from litestar import Request, Response
from litestar.exceptions import HTTPException

from metering.errors import MeteringError, unstorable_value

PROBLEM_JSON = "application/problem+json"
log = logging.getLogger("fairmeter.api")

_CODES_BY_STATUS = {
    400: "bad_request",
    401: "unauthenticated",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
    429: "rate_limited",
    503: "service_unavailable",
}


def problem(
    status: int,
    code: str,
    title: str,
    detail: str,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> Response[dict[str, Any]]:
    body = {
        "type": f"https://fairmeter.dev/problems/{code}",
        "title": title,
        "status": status,
        "code": code,
        "detail": detail,
        **extra,
    }
    return Response(body, status_code=status, media_type=PROBLEM_JSON, headers=headers)


def metering_error_handler(_: Request[Any, Any, Any], exc: MeteringError) -> Response[Any]:
    extra: dict[str, Any] = dict(exc.extra)
    if exc.errors:
        extra["errors"] = [e.as_dict() for e in exc.errors]
    headers = None
    if "retry_after_s" in extra:
        headers = {"Retry-After": str(extra["retry_after_s"])}
    return problem(exc.status, exc.code, exc.title, exc.detail, headers=headers, **extra)


def http_exception_handler(_: Request[Any, Any, Any], exc: HTTPException) -> Response[Any]:
    status = exc.status_code
    code = _CODES_BY_STATUS.get(status, "http_error")
    extra: dict[str, Any] = {}
    if isinstance(exc.extra, dict | list) and exc.extra:
        extra["errors"] = exc.extra
    return problem(
        status, code, exc.__class__.__name__, str(exc.detail), headers=exc.headers, **extra
    )


def database_down_handler(_: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    """A database that cannot be reached is a 503 the client may retry, never a 500."""
    log.warning("database unavailable: %s", exc.__class__.__name__)
    return problem(
        503,
        "database_unavailable",
        "Service unavailable",
        "the database is not reachable; retry later",
        headers={"Retry-After": "5"},
    )


def unstorable_value_handler(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    """PostgreSQL (or the driver) refused a value the client sent (a NUL character or a lone
    surrogate in a text, a number out of range): bad input, so a 400, never a 500. The value
    itself is not logged."""
    log.warning("value refused by the database: %s", exc.__class__.__name__)
    return metering_error_handler(request, unstorable_value())


def too_deep_handler(_: Request[Any, Any, Any], exc: RecursionError) -> Response[Any]:
    """A body nested deeper than the JSON decoder recurses (Litestar's own body parsing)."""
    return problem(400, "json_too_deep", "Bad request", "the JSON is nested too deeply")


def internal_error_handler(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    if isinstance(exc, sqlalchemy.exc.OperationalError | psycopg.OperationalError):
        return database_down_handler(request, exc)
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return problem(500, "internal_error", "Internal server error", "an unexpected error occurred")


EXCEPTION_HANDLERS: dict[Any, Any] = {
    MeteringError: metering_error_handler,
    HTTPException: http_exception_handler,
    sqlalchemy.exc.OperationalError: database_down_handler,
    sqlalchemy.exc.TimeoutError: database_down_handler,
    psycopg.OperationalError: database_down_handler,
    psycopg.DataError: unstorable_value_handler,
    sqlalchemy.exc.DataError: unstorable_value_handler,
    UnicodeEncodeError: unstorable_value_handler,
    RecursionError: too_deep_handler,
    Exception: internal_error_handler,
}
