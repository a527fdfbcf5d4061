"""Statement use cases: who may read which customer's statement, and what it contains."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

import psycopg

from metering.errors import FieldError, forbidden, not_found, validation_error
from metering.keys import Principal, Scope
from metering.periods import period_close
from metering.statements import links, query, totals
from metering.statements.query import StatementLine, StatementQuery, Totals

MAX_PAGE = 1000


@dataclass(frozen=True, slots=True)
class StatementPage:
    customer: str
    period: str
    closed: bool
    totals: Totals
    lines: list[StatementLine]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class IssuedLink:
    customer: str
    period: str
    path: str  # on this API's host: the customer's browser opens it with no key
    expires_at: datetime


def issue_link(
    conn: psycopg.Connection[Any],
    principal: Principal,
    customer: str,
    period_text: str,
    *,
    pepper: str,
    ttl_s: int,
    now: datetime,
) -> IssuedLink:
    """A signed, expiring link to one customer's statement for one period, for support to
    send: the API and the console both issue links here, so they follow one rule."""
    if principal.scope not in (Scope.SUPPORT, Scope.ADMIN):
        raise forbidden("only support and admin keys issue statement links")
    period = query.parse_period(period_text, now)
    authorize(conn, principal, customer)
    expires_at = now + timedelta(seconds=ttl_s)
    grant = links.StatementGrant(principal.tenant_id, customer, period, expires_at)
    token = links.sign(pepper, grant)
    return IssuedLink(customer, period, f"/v1/statement-links/{token}", expires_at)


def authorize(conn: psycopg.Connection[Any], principal: Principal, customer: str) -> None:
    """Customer keys read only their own customer (others: 404, so ids cannot be probed);
    support and admin keys read every customer of their tenant; ingest keys none (403)."""
    if principal.scope is Scope.INGEST:
        raise forbidden("ingest keys cannot read statements")
    if principal.scope is Scope.CUSTOMER and principal.customer_id != customer:
        raise not_found(f"no customer {customer}", code="customer_not_found")
    row = conn.execute(
        "SELECT 1 FROM customers WHERE tenant_id = %s AND id = %s",
        (principal.tenant_id, customer),
    ).fetchone()
    if row is None:
        raise not_found(f"no customer {customer}", code="customer_not_found")


def encode_cursor(line: StatementLine) -> str:
    raw = f"{line.ended_at.isoformat()}|{line.run_id}".encode()
    return base64.urlsafe_b64encode(raw).decode()


def decode_cursor(cursor: str | None) -> tuple[datetime, int] | None:
    if not cursor:
        return None
    try:
        ended, run_id = base64.urlsafe_b64decode(cursor.encode()).decode().split("|")
        return datetime.fromisoformat(ended), int(run_id)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise validation_error(
            [FieldError("$.cursor", "invalid_cursor", "use next_cursor from a previous page")]
        ) from None


def build_query(
    principal: Principal,
    customer: str,
    period_text: str,
    *,
    now: datetime,
    outcome: str | None = None,
    ended_from: date | None = None,
    ended_to: date | None = None,
) -> StatementQuery:
    def at_midnight(day: date | None) -> datetime | None:
        return datetime(day.year, day.month, day.day, tzinfo=UTC) if day else None

    return StatementQuery(
        tenant_id=principal.tenant_id,
        customer_id=customer,
        period=query.parse_period(period_text, now),
        outcome=query.check_outcome(outcome),
        ended_from=at_midnight(ended_from),
        ended_to=at_midnight(ended_to + timedelta(days=1))
        if ended_to and ended_to < date.max
        else None,
    )


def is_closed(period: str, now: datetime, close_delay_s: int) -> bool:
    return now >= period_close(period, timedelta(seconds=close_delay_s))


def statement_page(
    conn: psycopg.Connection[Any],
    principal: Principal,
    statement: StatementQuery,
    *,
    now: datetime,
    close_delay_s: int,
    cursor: str | None = None,
    limit: int = 100,
) -> StatementPage:
    authorize(conn, principal, statement.customer_id)
    if not 1 <= limit <= MAX_PAGE:
        raise validation_error(
            [FieldError("$.limit", "out_of_range", f"limit is between 1 and {MAX_PAGE}")]
        )
    lines = query.page(conn, statement, after=decode_cursor(cursor), limit=limit + 1)
    more = len(lines) > limit
    lines = lines[:limit]
    return StatementPage(
        customer=statement.customer_id,
        period=statement.period,
        closed=is_closed(statement.period, now, close_delay_s),
        totals=totals.totals(conn, statement),
        lines=lines,
        next_cursor=encode_cursor(lines[-1]) if more else None,
    )
