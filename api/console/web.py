"""What every console page shares: templates, the signed-in check, CSRF, flash messages."""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

from jinja2 import Environment, FileSystemLoader, select_autoescape
from litestar import Request, Response
from litestar.datastructures import Cookie, State
from litestar.enums import RequestEncodingType
from litestar.params import Body
from litestar.response import Redirect

from api.amounts import usd_html, usd_text
from api.console import session
from api.html_security import html_headers, new_nonce
from api.services import Services
from metering.console_sessions import session_principal
from metering.db import raw_transaction
from metering.errors import MeteringError
from metering.keys import Principal
from metering.money import describe_usd

log = logging.getLogger("fairmeter.console")

Form = Annotated[dict[str, str], Body(media_type=RequestEncodingType.URL_ENCODED)]
FLASH_COOKIE = "fm_console_flash"
HTML = "text/html"  # Litestar adds the charset


def when(moment: datetime | None) -> str:
    """A moment with its timezone named: a bare time is read as the reader's local one."""
    return "—" if moment is None else moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


TEMPLATES = Environment(
    loader=FileSystemLoader(Path(__file__).parents[1] / "templates" / "console"),
    autoescape=select_autoescape(["html"]),
    trim_blocks=True,
    lstrip_blocks=True,
)
TEMPLATES.filters.update(
    usd=usd_text,
    money=usd_html,
    exact_usd=describe_usd,
    when=when,
    url=lambda text: quote(str(text), safe=""),
)


@dataclass(frozen=True, slots=True)
class Console:
    """A signed-in support user: who they are and the CSRF token their forms carry."""

    principal: Principal
    token: str
    csrf: str


class NotSignedIn(Exception):
    pass


class CsrfRejected(Exception):
    pass


def services_of(state: State) -> Services:
    services: Services = state.services
    return services


def signed_in(request: Request[Any, Any, Any], services: Services) -> Console:
    """The session behind the cookie; :class:`NotSignedIn` (→ the sign-in page) otherwise:
    no session, signed out, expired, or its key revoked or expired."""
    token = request.cookies.get(session.SESSION_COOKIE)
    if not token:
        raise NotSignedIn
    with raw_transaction(services.engine) as conn:
        principal = session_principal(conn, token, datetime.now(UTC))
    if principal is None or principal.scope not in session.CONSOLE_SCOPES:
        raise NotSignedIn
    return Console(principal, token, session.csrf_token(token, services.settings.key_pepper))


def check_csrf(console: Console, services: Services, form: Mapping[str, str]) -> None:
    if not session.csrf_matches(console.token, services.settings.key_pepper, form.get("csrf")):
        raise CsrfRejected


def secure(request: Request[Any, Any, Any]) -> bool:
    return request.url.scheme == "https"


def cookie(request: Request[Any, Any, Any], key: str, value: str, max_age: int) -> Cookie:
    return Cookie(
        key=key,
        value=value,
        path=session.COOKIE_PATH,
        max_age=max_age,
        httponly=True,
        samesite="strict",
        secure=secure(request),
    )


def render(template: str, *, status: int = 200, **context: Any) -> Response[str]:
    nonce = new_nonce()
    html = TEMPLATES.get_template(template).render(csp_nonce=nonce, **context)
    return Response(html, status_code=status, media_type=HTML, headers=html_headers(nonce))


def flash_cookie(request: Request[Any, Any, Any], text: str, level: str = "ok") -> Cookie:
    raw = json.dumps({"level": level, "text": text}).encode()
    return cookie(request, FLASH_COOKIE, base64.urlsafe_b64encode(raw).decode(), max_age=60)


def take_flash(request: Request[Any, Any, Any]) -> dict[str, str] | None:
    """The message left by the previous POST (the caller deletes the cookie)."""
    raw = request.cookies.get(FLASH_COOKIE)
    if not raw:
        return None
    try:
        flash = json.loads(base64.urlsafe_b64decode(raw.encode()))
        return {"level": str(flash["level"]), "text": str(flash["text"])}
    except (ValueError, KeyError, TypeError):
        return None


def redirect_with_flash(
    request: Request[Any, Any, Any], path: str, text: str, level: str = "ok"
) -> Redirect:
    return Redirect(path, status_code=303, cookies=[flash_cookie(request, text, level)])


def run_path(run: str) -> str:
    return f"/console/runs/{quote(run, safe='')}"


def error_message(exc: MeteringError) -> str:
    """A sentence for people: the detail, plus each bad field's message."""
    text = "; ".join(e.message for e in exc.errors) if exc.errors else exc.detail
    return text[:1].upper() + text[1:]


def not_signed_in_handler(request: Request[Any, Any, Any], _: NotSignedIn) -> Response[Any]:
    query = {"next": request.url.path} if request.method == "GET" else None
    response = Redirect("/console/login", status_code=303, query_params=query)
    response.delete_cookie(session.SESSION_COOKIE, path=session.COOKIE_PATH)
    return response


def csrf_handler(_: Request[Any, Any, Any], __: CsrfRejected) -> Response[Any]:
    return render(
        "error.html",
        status=403,
        title="This form has expired",
        message="The form was not sent from this console session (its security "
        "token is missing or stale), so nothing was changed. Go back, reload the "
        "page and try again.",
    )


def metering_error_handler(_: Request[Any, Any, Any], exc: MeteringError) -> Response[Any]:
    return render("error.html", status=exc.status, title=exc.title, message=error_message(exc))


def client_error_handler(_: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    status = int(getattr(exc, "status_code", 400))
    if status >= 500:
        log.error("console request failed", exc_info=exc)
        return render(
            "error.html",
            status=500,
            title="Something went wrong",
            message="The console could not finish this request; try again.",
        )
    return render(
        "error.html",
        status=status,
        title="That did not work",
        message="The request was not understood; go back and try again.",
    )
