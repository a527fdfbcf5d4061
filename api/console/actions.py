"""Dispute actions, each in two steps: the first POST shows what will happen, the second
(``confirm=yes``) does it in one transaction and returns to the run page with a message."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg
from litestar import Request, Response, post
from litestar.datastructures import State
from litestar.params import FromPath

from api.amounts import usd_text as usd
from api.console.forms import credit_from, required_text
from api.console.pages import run_page_response
from api.console.web import (
    Console,
    Form,
    check_csrf,
    error_message,
    redirect_with_flash,
    render,
    run_path,
    services_of,
    signed_in,
)
from api.services import Services
from metering.db import raw_transaction
from metering.disputes import service
from metering.disputes.timeline import Dispute, disputes, timeline
from metering.errors import MeteringError, conflict, not_found
from metering.money import describe_usd
from metering.runs import find_run_id
from metering.statements.service import issue_link


@dataclass(frozen=True, slots=True)
class Plan:
    """What a confirmed action will do, in words, and how to do it."""

    title: str
    lines: list[str]
    button: str
    execute: Callable[[psycopg.Connection[Any]], str]  # → the message shown afterwards
    warnings: list[str] = field(default_factory=list)
    danger: bool = False
    # The amounts the person saw; confirming is refused if they changed in between, so
    # "you are about to credit 1.23 USD" is exactly what happens.
    expect: str = ""


@dataclass(frozen=True, slots=True)
class Ask:
    console: Console
    services: Services
    run: str
    form: dict[str, str]

    @property
    def now(self) -> datetime:
        return datetime.now(UTC)


Planner = Callable[[psycopg.Connection[Any], Ask], Plan]


def _amount(micros: int) -> str:
    exact = describe_usd(micros)
    return f"{usd(micros)} USD" + ("" if exact == usd(micros) else f" (exactly {exact} USD)")


def _open_dispute_of(conn: psycopg.Connection[Any], ask: Ask, run_id: int) -> Dispute:
    dispute_id = ask.form.get("dispute_id", "")
    on_run = {str(d.id): d for d in disputes(conn, ask.console.principal, run_id=run_id)}
    found = on_run.get(dispute_id)
    if found is None:
        raise not_found(f"run {ask.run} has no dispute {dispute_id}", code="dispute_not_found")
    if found.status != "open":
        raise conflict(f"dispute #{found.id} is already {found.status}", code="dispute_resolved")
    return found


def plan_open(conn: psycopg.Connection[Any], ask: Ask) -> Plan:
    claim = required_text(ask.form, "claim", "describe the customer's claim")
    money = service.run_money(conn, find_run_id(conn, ask.console.principal, ask.run))
    principal = ask.console.principal

    def execute(c: psycopg.Connection[Any]) -> str:
        return f"Dispute #{service.open_dispute(c, principal, ask.run, claim)} opened."

    return Plan(
        title="Open a dispute",
        lines=[
            f"You are about to open a dispute on run {ask.run} for customer "
            f"{money.customer_id}, with this claim:",
            f"“{claim}”",
            "No money moves until the dispute is approved.",
        ],
        button="Open dispute",
        execute=execute,
    )


def _credit_warnings(
    conn: psycopg.Connection[Any], ask: Ask, money: service.RunMoney, micros: int
) -> list[str]:
    """The refusal confirming would meet, asked of the use case itself, so the page and the
    action never disagree about the rules."""
    refusal = service.credit_refusal(
        conn,
        ask.console.principal,
        money,
        micros,
        settings=ask.services.settings,
        now=ask.now,
    )
    if refusal is None:
        return []
    return [f"{error_message(refusal)}; this credit will be refused."]


def plan_approve(conn: psycopg.Connection[Any], ask: Ask) -> Plan:
    credit = credit_from(ask.form)
    reason = required_text(ask.form, "reason", "give the reason the customer will see")
    principal, settings = ask.console.principal, ask.services.settings
    run_id = find_run_id(conn, principal, ask.run)
    dispute = _open_dispute_of(conn, ask, run_id)
    # Locked until the action commits: what the page shows is what confirming does.
    money = service.locked_run_money(conn, run_id)
    micros = credit.micros(money.billed_micros)
    warnings = _credit_warnings(conn, ask, money, micros)

    def execute(c: psycopg.Connection[Any]) -> str:
        service.approve_dispute(
            c, principal, dispute.id, credit, reason=reason, settings=settings, now=ask.now
        )
        return f"Dispute #{dispute.id} approved: {_amount(micros)} credited to run {ask.run}."

    return Plan(
        title=f"Approve dispute #{dispute.id}",
        lines=[
            f"You are about to credit {_amount(micros)} to run {ask.run}.",
            f"Billed {usd(money.billed_micros)} USD → {usd(money.billed_micros - micros)} "
            f"USD; credited {usd(money.credited_micros)} USD → "
            f"{usd(money.credited_micros + micros)} USD.",
            f"Reason the customer will see: “{reason}”",
        ]
        + (["The run is held for review; approving also releases the hold."] if money.held else []),
        button=f"Credit {usd(micros)} USD",
        execute=execute,
        warnings=warnings,
        expect=f"{money.billed_micros}:{money.credited_micros}:{micros}",
    )


def plan_credit(conn: psycopg.Connection[Any], ask: Ask) -> Plan:
    """A goodwill credit without a dispute: the console's face of ``POST …/credit``."""
    credit = credit_from(ask.form)
    reason = required_text(ask.form, "reason", "give the reason the customer will see")
    principal, settings = ask.console.principal, ask.services.settings
    run_id = find_run_id(conn, principal, ask.run)
    money = service.locked_run_money(conn, run_id)
    micros = credit.micros(money.billed_micros)
    warnings = _credit_warnings(conn, ask, money, micros)

    def execute(c: psycopg.Connection[Any]) -> str:
        service.grant_credit(
            c,
            principal,
            run_id,
            credit,
            reason=reason,
            settings=settings,
            now=ask.now,
            action="run.credit",
        )
        return f"{_amount(micros)} credited to run {ask.run}."

    return Plan(
        title="Credit the run",
        lines=[
            f"You are about to credit {_amount(micros)} to run {ask.run}.",
            f"Billed {usd(money.billed_micros)} USD → {usd(money.billed_micros - micros)} "
            f"USD; credited {usd(money.credited_micros)} USD → "
            f"{usd(money.credited_micros + micros)} USD.",
            f"Reason the customer will see: “{reason}”",
        ],
        button=f"Credit {usd(micros)} USD",
        execute=execute,
        warnings=warnings,
        expect=f"{money.billed_micros}:{money.credited_micros}:{micros}",
    )


def plan_reject(conn: psycopg.Connection[Any], ask: Ask) -> Plan:
    reason = required_text(ask.form, "reason", "give the reason the customer will see")
    principal = ask.console.principal
    dispute = _open_dispute_of(conn, ask, find_run_id(conn, principal, ask.run))

    def execute(c: psycopg.Connection[Any]) -> str:
        service.reject_dispute(c, principal, dispute.id, reason=reason, now=ask.now)
        return f"Dispute #{dispute.id} rejected; no amount changed."

    return Plan(
        title=f"Reject dispute #{dispute.id}",
        lines=[
            f"You are about to reject dispute #{dispute.id} on run {ask.run}. No money moves.",
            f"Reason the customer will see: “{reason}”",
        ],
        button="Reject dispute",
        execute=execute,
        danger=True,
    )


def plan_release(conn: psycopg.Connection[Any], ask: Ask) -> Plan:
    reason = required_text(ask.form, "reason", "say why the hold can be released")
    principal, settings = ask.console.principal, ask.services.settings
    money = service.locked_run_money(conn, find_run_id(conn, principal, ask.run))
    if not money.held:
        raise conflict("the run is not held for review", code="run_not_held")

    def execute(c: psycopg.Connection[Any]) -> str:
        service.release_hold(c, principal, ask.run, reason=reason, settings=settings, now=ask.now)
        return f"Run {ask.run} released from review and billed."

    return Plan(
        title="Release the hold",
        lines=[
            f"You are about to release run {ask.run} from review and bill it as the "
            f"policy proposed: {usd(money.billed_micros)} USD billed, "
            f"{usd(money.credited_micros)} USD credited.",
            f"Reason: “{reason}”",
        ],
        button=f"Release and bill {usd(money.billed_micros)} USD",
        execute=execute,
        expect=f"{money.billed_micros}:{money.credited_micros}",
    )


def _act(
    request: Request[Any, Any, Any], state: State, run: str, form: dict[str, str], planner: Planner
) -> Response[Any]:
    services = services_of(state)
    console = signed_in(request, services)
    check_csrf(console, services, form)
    ask = Ask(console, services, run, form)
    try:
        with raw_transaction(services.engine) as conn:
            plan = planner(conn, ask)
            if form.get("confirm") == "yes":
                if form.get("expect", "") != plan.expect:
                    raise conflict(
                        "the run's amounts changed while you were reviewing; review again",
                        code="amounts_changed",
                    )
                message = plan.execute(conn)
            else:
                skip = ("csrf", "confirm", "expect")
                hidden = {k: v for k, v in form.items() if k not in skip} | {"expect": plan.expect}
                return render(
                    "confirm.html",
                    me=console.principal,
                    csrf=console.csrf,
                    nav="queue",
                    plan=plan,
                    run=run,
                    hidden=hidden,
                    # Built from the run id, not the decoded request path, which for an
                    # id with "?" or "#" in it (stored before the id grammar) is no URL.
                    action=f"{run_path(run)}/{request.url.path.rsplit('/', 1)[-1]}",
                )
    except MeteringError as exc:
        return _refused(request, console, services, run, form, exc)
    return redirect_with_flash(request, run_path(run), message)


def _refused(
    request: Request[Any, Any, Any],
    console: Console,
    services: Services,
    run: str,
    form: dict[str, str],
    exc: MeteringError,
) -> Response[Any]:
    """The run page again, with what went wrong and the values typed so far."""
    flash = {"level": "error", "text": f"Nothing was changed. {error_message(exc)}."}
    with raw_transaction(services.engine) as conn:
        found = timeline(conn, console.principal, run)  # a missing run → the 404 page
    return run_page_response(
        request,
        console,
        found,
        status=exc.status,
        flash=flash,
        form=form,
        limit_micros=services.settings.support_credit_limit_micros,
        daily_limit_micros=services.settings.support_credit_customer_daily_limit_micros,
    )


@post("/runs/{run:str}/dispute", sync_to_thread=True, status_code=200)
def open_dispute(
    request: Request[Any, Any, Any], state: State, run: FromPath[str], data: Form
) -> Response[Any]:
    return _act(request, state, run, data, plan_open)


@post("/runs/{run:str}/approve", sync_to_thread=True, status_code=200)
def approve_dispute(
    request: Request[Any, Any, Any], state: State, run: FromPath[str], data: Form
) -> Response[Any]:
    return _act(request, state, run, data, plan_approve)


@post("/runs/{run:str}/reject", sync_to_thread=True, status_code=200)
def reject_dispute(
    request: Request[Any, Any, Any], state: State, run: FromPath[str], data: Form
) -> Response[Any]:
    return _act(request, state, run, data, plan_reject)


@post("/runs/{run:str}/release", sync_to_thread=True, status_code=200)
def release_hold(
    request: Request[Any, Any, Any], state: State, run: FromPath[str], data: Form
) -> Response[Any]:
    return _act(request, state, run, data, plan_release)


@post("/runs/{run:str}/credit", sync_to_thread=True, status_code=200)
def credit_run(
    request: Request[Any, Any, Any], state: State, run: FromPath[str], data: Form
) -> Response[Any]:
    return _act(request, state, run, data, plan_credit)


@post("/runs/{run:str}/statement-link", sync_to_thread=True, status_code=200)
def statement_link(
    request: Request[Any, Any, Any], state: State, run: FromPath[str], data: Form
) -> Response[Any]:
    """A signed link to the run's customer's statement, for support to send: no money
    moves, so no confirmation step; the link is shown once on the run page."""
    services = services_of(state)
    console = signed_in(request, services)
    check_csrf(console, services, data)
    settings = services.settings
    try:
        with raw_transaction(services.engine) as conn:
            found = timeline(conn, console.principal, run)
            issued = issue_link(
                conn,
                console.principal,
                found.run.customer,
                data.get("period", "").strip() or "current",
                pepper=settings.key_pepper,
                ttl_s=settings.statement_link_ttl_s,
                now=datetime.now(UTC),
            )
    except MeteringError as exc:
        return _refused(request, console, services, run, data, exc)
    return run_page_response(
        request,
        console,
        found,
        limit_micros=settings.support_credit_limit_micros,
        daily_limit_micros=settings.support_credit_customer_daily_limit_micros,
        statement_link=issued,
    )
