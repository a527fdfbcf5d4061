"""What the admin-only resources share at the HTTP edge: authenticate an admin key, then
run the use case off the event loop; read a time field; and an OPTIONS answer for paths
several handlers share.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

from anyio import to_thread
from litestar import Request, Response, route
from litestar.datastructures import State
from litestar.enums import HttpMethod
from litestar.routes import HTTPRoute

from api.services import Services
from metering.errors import FieldError, validation_error
from metering.keys import Principal, Scope

T = TypeVar("T")


async def as_admin(
    request: Request[Any, Any, Any], state: State, work: Callable[[Services, Principal], T]
) -> T:
    """``work`` with the admin principal of the request (401/403 before it runs)."""
    services: Services = state.services
    principal = services.authenticate(request, Scope.ADMIN)
    return await to_thread.run_sync(work, services, principal)


def rfc3339(text: str, path: str) -> datetime:
    """``text`` as an aware moment; 422 naming ``path`` for anything else (a time without
    its zone too: read as the server's local time it would silently shift by hours).

    One parser for every admin body's time field; whether the field may be left out is
    the caller's to say (it passes only the text it has)."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise validation_error(
            [FieldError(path, "invalid_time", "an RFC 3339 time with its zone, e.g. …Z")]
        )
    return moment


def shared_options(path: str) -> Any:
    """OPTIONS for a path that several handlers share, answering with all their methods.

    Litestar 2 makes the OPTIONS handler when the first handler of a path is registered
    and never updates its ``Allow`` (litestar-org/litestar#4169, fixed in 3.0): a client
    asking what ``/v1/webhooks/endpoints`` allows was told POST only. This one reads the
    route as finally built."""

    def allow(request: Request[Any, Any, Any]) -> Response[None]:
        template = request.scope.get("path_template")
        methods = {
            method
            for r in request.app.routes
            if isinstance(r, HTTPRoute) and r.path_format == template
            for method in r.methods
        }
        return Response(None, status_code=204, headers={"Allow": ", ".join(sorted(methods))})

    return route(
        path,
        http_method=[HttpMethod.OPTIONS],
        include_in_schema=False,
        sync_to_thread=False,
        name=f"options:{path}",
    )(allow)
