"""Console pages: sign in and out, the queue with search, a run's timeline, the audit log."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from litestar import Request, Response, get, post
from litestar.datastructures import State
from litestar.params import FromPath, FromQuery, QueryParameter
from litestar.response import Redirect

from api.console import session
from api.console.forms import day_start, safe_next
from api.console.timeline_svg import timeline_svg
from api.console.web import (
    FLASH_COOKIE,
    Console,
    Form,
    NotSignedIn,
    check_csrf,
    cookie,
    render,
    services_of,
    signed_in,
    take_flash,
)
from metering.console_sessions import end_session, open_session
from metering.db import raw_transaction
from metering.disputes import audit
from metering.disputes.timeline import Timeline, disputes, search_runs, timeline
from metering.errors import MeteringError
from metering.statements.service import IssuedLink

OUTCOMES = ("confirmed", "partially_credited", "refunded", "held_for_review")
LOGIN_TTL_S = 3600


def _login_form(
    request: Request[Any, Any, Any],
    *,
    error: str | None = None,
    next_path: str = "/console",
    status: int = 200,
) -> Response[str]:
    nonce = session.login_nonce()
    response = render(
        "login.html", status=status, csrf=nonce, error=error, next_path=safe_next(next_path)
    )
    response.set_cookie(cookie(request, session.LOGIN_COOKIE, nonce, LOGIN_TTL_S))
    return response


@get("/login", sync_to_thread=True)
def login_page(
    request: Request[Any, Any, Any],
    state: State,
    next_path: Annotated[str | None, QueryParameter(name="next")] = None,
) -> Response[Any]:
    try:
        signed_in(request, services_of(state))
    except NotSignedIn:
        return _login_form(request, next_path=next_path or "/console")
    return Redirect(safe_next(next_path), status_code=303)


@post("/login", sync_to_thread=True, status_code=200)
def login(request: Request[Any, Any, Any], state: State, data: Form) -> Response[Any]:
    services = services_of(state)
    next_path = data.get("next", "/console")
    if not session.same_nonce(request.cookies.get(session.LOGIN_COOKIE), data.get("csrf")):
        return _login_form(
            request,
            status=403,
            next_path=next_path,
            error="The sign-in form had expired. Please paste your key again.",
        )
    try:
        principal = services.keys.authenticate(data.get("key", "").strip())
    except MeteringError as exc:
        return _login_form(
            request, status=401, next_path=next_path, error=f"That key does not work: {exc.detail}."
        )
    if principal.scope not in session.CONSOLE_SCOPES:
        return _login_form(
            request,
            status=403,
            next_path=next_path,
            error=f"This is a {principal.scope.value} key. Only support and "
            "admin keys can sign in to the console.",
        )
    with raw_transaction(services.engine) as conn:
        token = open_session(conn, principal, datetime.now(UTC))
    response = Redirect(safe_next(next_path), status_code=303)
    response.set_cookie(
        cookie(request, session.SESSION_COOKIE, token, int(session.SESSION_TTL.total_seconds()))
    )
    response.delete_cookie(session.LOGIN_COOKIE, path=session.COOKIE_PATH)
    return response


@post("/logout", sync_to_thread=True, status_code=200)
def logout(request: Request[Any, Any, Any], state: State, data: Form) -> Response[Any]:
    services = services_of(state)
    console = signed_in(request, services)
    check_csrf(console, services, data)
    with raw_transaction(services.engine) as conn:
        end_session(conn, console.token)
    response = Redirect("/console/login", status_code=303)
    response.delete_cookie(session.SESSION_COOKIE, path=session.COOKIE_PATH)
    return response


def page_response(
    request: Request[Any, Any, Any], template: str, console: Console, **context: Any
) -> Response[str]:
    """A signed-in page; shows (and clears) the flash message left by the last action."""
    flash = context.pop("flash", None) or take_flash(request)
    response = render(template, me=console.principal, csrf=console.csrf, flash=flash, **context)
    if request.cookies.get(FLASH_COOKIE):
        response.delete_cookie(FLASH_COOKIE, path=session.COOKIE_PATH)
    return response


@get("/", sync_to_thread=True)
def queue_page(
    request: Request[Any, Any, Any],
    state: State,
    q: FromQuery[str | None] = None,
    outcome: FromQuery[str | None] = None,
    ended_from: FromQuery[str | None] = None,
    ended_to: FromQuery[str | None] = None,
) -> Response[str]:
    services = services_of(state)
    console = signed_in(request, services)
    principal = console.principal
    outcome = outcome if outcome in OUTCOMES else None
    searching = bool(q or outcome or ended_from or ended_to)
    with raw_transaction(services.engine) as conn:
        queue = search_runs(conn, principal, queue=True, limit=200)
        open_disputes = disputes(conn, principal, status="open", limit=100)
        results = search_runs(
            conn,
            principal,
            text=(q or "").strip() or None,
            outcome=outcome,
            ended_from=day_start(ended_from),
            ended_to=day_start(ended_to, next_day=True),
            limit=100 if searching else 15,
        )
    held = [r for r in queue if r.outcome == "held_for_review"]
    # The queue also holds runs parked after repeated settlement failures.
    parked = [r for r in queue if r.parked]
    return page_response(
        request,
        "queue.html",
        console,
        nav="queue",
        held=held,
        parked=parked,
        disputes=open_disputes,
        runs={r.run: r for r in queue},
        results=results,
        searching=searching,
        outcomes=OUTCOMES,
        search={
            "q": q or "",
            "outcome": outcome or "",
            "ended_from": ended_from or "",
            "ended_to": ended_to or "",
        },
    )


def run_page_response(
    request: Request[Any, Any, Any],
    console: Console,
    found: Timeline,
    *,
    status: int = 200,
    flash: dict[str, str] | None = None,
    form: dict[str, str] | None = None,
    limit_micros: int,
    daily_limit_micros: int,
    statement_link: IssuedLink | None = None,
) -> Response[str]:
    """The run page; actions re-render it with their error and the values typed so far,
    and a statement link just issued, to copy (it is shown once, never stored)."""
    view = found.run
    evidence = view.decisions[-1].evidence_event_ids if view.decisions else []
    open_dispute = next((d for d in found.disputes if d.status == "open"), None)
    response = page_response(
        request,
        "run.html",
        console,
        nav="queue",
        flash=flash,
        t=found,
        view=view,
        svg=timeline_svg(found.events, evidence),
        open_dispute=open_dispute,
        form=form or {},
        limit_micros=limit_micros,
        daily_limit_micros=daily_limit_micros,
        kinds=sorted({e.type for e in found.events}),
        statement_link=statement_link,
        statement_link_url=(
            str(request.base_url).rstrip("/") + statement_link.path if statement_link else None
        ),
    )
    response.status_code = status
    return response


@get("/runs/{run:str}", sync_to_thread=True)
def run_page(request: Request[Any, Any, Any], state: State, run: FromPath[str]) -> Response[str]:
    services = services_of(state)
    console = signed_in(request, services)
    with raw_transaction(services.engine) as conn:
        found = timeline(conn, console.principal, run)
    return run_page_response(
        request,
        console,
        found,
        limit_micros=services.settings.support_credit_limit_micros,
        daily_limit_micros=services.settings.support_credit_customer_daily_limit_micros,
    )


@get("/audit", sync_to_thread=True)
def audit_page(
    request: Request[Any, Any, Any], state: State, target: FromQuery[str | None] = None
) -> Response[str]:
    services = services_of(state)
    console = signed_in(request, services)
    with raw_transaction(services.engine) as conn:
        rows = audit.entries(
            conn, console.principal.tenant_id, target_id=(target or "").strip() or None, limit=200
        )
    return page_response(
        request, "audit.html", console, nav="audit", entries=rows, target=target or ""
    )
