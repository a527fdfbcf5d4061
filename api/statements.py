"""GET /v1/customers/{customer}/statements/{period}[.csv|.html] — JSON, CSV or HTML."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import msgspec
import psycopg
from anyio import to_thread
from jinja2 import Environment, FileSystemLoader, select_autoescape
from litestar import Request, Response, get, post
from litestar.datastructures import State
from litestar.params import FromPath, FromQuery, JSONBody
from litestar.response import Stream

from api.amounts import usd_html
from api.html_security import html_headers, new_nonce
from api.openapi_docs import (
    AUTHENTICATED,
    StatementOperation,
    StatementPageOperation,
    keys,
    problems,
)
from api.services import Services
from api.wire import InvoiceTotalsReply, StatementLineReply, StatementReply, TotalsReply
from metering.billing.rate_store import invoice_figures
from metering.billing.rates import CURRENCY_UNKNOWN, InvoiceFigures, invoice_document
from metering.config import Settings
from metering.db import raw_transaction
from metering.keys import Principal, Scope
from metering.statements import links, query, totals
from metering.statements.render import csv_chunks, daily_chart_svg
from metering.statements.service import (
    IssuedLink,
    StatementPage,
    authorize,
    build_query,
    issue_link,
    statement_page,
)

_UNSAFE_IN_FILENAME = re.compile(r"[^A-Za-z0-9._-]")
TEMPLATES = Environment(
    loader=FileSystemLoader(Path(__file__).parent / "templates"),
    autoescape=select_autoescape(["html"]),
)


def _format(period: str, accept: str) -> tuple[str, str]:
    for suffix in ("csv", "html"):
        if period.endswith(f".{suffix}"):
            return period.removesuffix(f".{suffix}"), suffix
    if "text/csv" in accept:
        return period, "csv"
    if "text/html" in accept and "application/json" not in accept:
        return period, "html"
    return period, "json"


@get(
    "/v1/customers/{customer:str}/statements/{period:str}",
    summary="A customer's usage statement for a month (JSON, CSV or HTML)",
    tags=["statements"],
    security=keys(Scope.CUSTOMER, Scope.SUPPORT, Scope.ADMIN),
    responses=problems(*AUTHENTICATED, 404, 422),
    operation_class=StatementOperation,
)
async def get_statement(
    request: Request[Any, Any, Any],
    customer: FromPath[str],
    period: FromPath[str],
    state: State,
    outcome: FromQuery[str | None] = None,
    ended_from: FromQuery[date | None] = None,
    ended_to: FromQuery[date | None] = None,
    cursor: FromQuery[str | None] = None,
    limit: FromQuery[int] = 100,
) -> Response[Any]:
    """JSON by default; CSV for ``.csv`` or ``Accept: text/csv``; HTML for ``.html``.

    The annotation is a Response so each branch sets its own media type."""
    services: Services = state.services
    period, kind = _format(period, request.headers.get("accept", ""))
    now = datetime.now(UTC)
    principal = services.authenticate(
        request, Scope.CUSTOMER, Scope.SUPPORT, Scope.ADMIN, Scope.INGEST
    )
    statement = build_query(
        principal,
        customer,
        period,
        now=now,
        outcome=outcome,
        ended_from=ended_from,
        ended_to=ended_to,
    )
    if kind == "csv":
        await to_thread.run_sync(_authorize, services, principal, customer)
        return Stream(
            _csv(services, statement),
            media_type="text/csv",  # Litestar adds "; charset=utf-8" to text/*
            headers={"content-disposition": _attachment(customer, statement.period)},
        )
    shown = await to_thread.run_sync(_page, services, principal, statement, now, cursor, limit)
    if kind == "html":
        nonce = new_nonce()
        return Response(
            await to_thread.run_sync(_html, services, shown, statement, nonce),
            media_type="text/html",
            headers=html_headers(nonce),
        )
    return Response(_json(shown), media_type="application/json")


def _attachment(customer: str, period: str) -> str:
    return attachment(f"statement-{customer}-{period}.csv")


def attachment(filename: str) -> str:
    """``Content-Disposition`` for a download, per RFC 6266: the name as RFC 8187
    ``filename*`` (percent-encoded UTF-8; path separators and control characters made
    ``_``) and, for clients that only know ``filename``, an ASCII copy with everything but
    letters, digits and ``. _ -`` made ``_``. Neither can hold a quote, a ``;`` or a line
    break, so no id can add a parameter or break the header (ids stored before the id
    grammar may hold any of them)."""
    readable = "".join(c if c.isprintable() and c not in "/\\" else "_" for c in filename)
    fallback = _UNSAFE_IN_FILENAME.sub("_", readable)
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(readable, safe='')}"


def _issue_link(services: Services, principal: Principal, customer: str, period: str) -> IssuedLink:
    with raw_transaction(services.engine) as conn:
        return issue_link(
            conn,
            principal,
            customer,
            period,
            pepper=services.settings.key_pepper,
            ttl_s=services.settings.statement_link_ttl_s,
            now=datetime.now(UTC),
        )


def _authorize(services: Services, principal: Principal, customer: str) -> None:
    with raw_transaction(services.engine) as conn:
        authorize(conn, principal, customer)


@dataclass(frozen=True, slots=True)
class ShownStatement:
    """A statement page and its totals in the customer's billing currency (None while it is
    not known): statements and billing are separate use cases, joined here at the edge."""

    page: StatementPage
    invoice: InvoiceFigures | None


def shown_statement(
    conn: psycopg.Connection[Any],
    principal: Principal,
    statement: query.StatementQuery,
    settings: Settings,
    *,
    now: datetime,
    cursor: str | None = None,
    limit: int = 100,
) -> ShownStatement:
    """The page (``statement_page``) with its invoice figures, in the caller's transaction
    (the API's and the CLI's)."""
    page = statement_page(
        conn,
        principal,
        statement,
        now=now,
        close_delay_s=settings.period_close_delay_s,
        cursor=cursor,
        limit=limit,
    )
    invoice = invoice_figures(
        conn,
        statement.tenant_id,
        statement.customer_id,
        billed_micros=page.totals.billed_micros,
        credited_micros=page.totals.credited_micros,
        unit_micros=settings.stripe_meter_unit_micros,
    )
    return ShownStatement(page, invoice)


def _page(
    services: Services,
    principal: Principal,
    statement: query.StatementQuery,
    now: datetime,
    cursor: str | None,
    limit: int,
) -> ShownStatement:
    with raw_transaction(services.engine) as conn:
        return shown_statement(
            conn, principal, statement, services.settings, now=now, cursor=cursor, limit=limit
        )


def _csv(services: Services, statement: query.StatementQuery) -> Iterator[bytes]:
    with raw_transaction(services.engine) as conn:
        yield from csv_chunks(query.stream(conn, statement))


def _html(
    services: Services, shown: ShownStatement, statement: query.StatementQuery, nonce: str
) -> str:
    with raw_transaction(services.engine) as conn:
        days = totals.daily(conn, statement)
    return render_html(shown, days, usd_html, csp_nonce=nonce)


def render_html(
    shown: ShownStatement, days: list[tuple[date, int, int]], usd: Any, csp_nonce: str = ""
) -> str:
    """The statement page (``usd``: how an amount is written)."""
    return TEMPLATES.get_template("statement.html").render(
        page=shown.page,
        invoice=shown.invoice,
        chart=daily_chart_svg(shown.page.period, days),
        usd=usd,
        csp_nonce=csp_nonce,
        currency_unknown=CURRENCY_UNKNOWN,
    )


def _json(shown: ShownStatement) -> StatementReply:
    page, invoice = shown.page, shown.invoice
    totals = page.totals
    return StatementReply(
        customer=page.customer,
        period=page.period,
        closed=page.closed,
        totals=TotalsReply(
            gross_micros=totals.gross_micros,
            billed_micros=totals.billed_micros,
            credited_micros=totals.credited_micros,
            held_micros=totals.held_micros,
            runs=totals.runs,
            runs_restored=totals.runs_restored,
            corrections=totals.corrections,
        ),
        lines=[
            StatementLineReply(
                kind=line.kind,
                run=line.run,
                version=line.version,
                started_at=line.started_at,
                ended_at=line.ended_at,
                models=line.models,
                input_tokens=line.input_tokens,
                cached_input_tokens=line.cached_input_tokens,
                output_tokens=line.output_tokens,
                gross_micros=line.gross_micros,
                billed_micros=line.billed_micros,
                credited_micros=line.credited_micros,
                outcome=line.outcome,
                status=line.status,
                explanation=line.explanation,
                corrects_period=line.corrects_period,
                stripe=line.stripe,
            )
            for line in page.lines
        ],
        next_cursor=page.next_cursor,
        invoice=None if invoice is None else invoice_reply(invoice),
        invoice_note=CURRENCY_UNKNOWN if invoice is None else None,
    )


def invoice_reply(figures: InvoiceFigures) -> InvoiceTotalsReply:
    """The statement's ``invoice`` object."""
    return msgspec.convert(invoice_document(figures), InvoiceTotalsReply)


class StatementLinkRequest(msgspec.Struct, forbid_unknown_fields=True):
    period: str  # YYYY-MM or "current"


class StatementLinkReply(msgspec.Struct):
    url: str  # path and query: the customer opens it on this API's host
    expires_at: datetime


@post(
    "/v1/support/customers/{customer:str}/statement-links",
    status_code=201,
    tags=["support"],
    summary="A signed, expiring link a customer opens their statement with in a browser",
    security=keys(Scope.SUPPORT, Scope.ADMIN),
    responses=problems(*AUTHENTICATED, 404, 422),
)
async def create_statement_link(
    request: Request[Any, Any, Any],
    customer: FromPath[str],
    data: JSONBody[StatementLinkRequest],
    state: State,
) -> StatementLinkReply:
    services: Services = state.services
    principal = services.authenticate(request, Scope.SUPPORT, Scope.ADMIN)
    issued = await to_thread.run_sync(_issue_link, services, principal, customer, data.period)
    return StatementLinkReply(url=issued.path, expires_at=issued.expires_at)


@get(
    "/v1/statement-links/{token:str}",
    summary="A customer's statement page, opened from a signed link (no key needed)",
    tags=["statements"],
    responses=problems(401, 403, 404, 422),
    operation_class=StatementPageOperation,
)
async def open_statement_link(token: FromPath[str], state: State) -> Response[Any]:
    """The HTML statement a link grants: a browser cannot send an Authorization header
    from a link, so the signed token in the path is the credential."""
    services: Services = state.services
    now = datetime.now(UTC)
    grant = links.verify(services.settings.key_pepper, token, now=now)
    principal = grant.principal()
    statement = build_query(principal, grant.customer_id, grant.period, now=now)
    shown = await to_thread.run_sync(_page, services, principal, statement, now, None, 100)
    nonce = new_nonce()
    return Response(
        await to_thread.run_sync(_html, services, shown, statement, nonce),
        media_type="text/html",
        headers=html_headers(nonce),
    )
