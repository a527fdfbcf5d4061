"""/v1/support/* — the support API: run search and timeline, disputes, credits, audit log."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, date, datetime
from typing import Any, TypeVar

import msgspec
from anyio import to_thread
from litestar import Request, get, post
from litestar.datastructures import State
from litestar.params import FromPath, FromQuery, JSONBody

from api.openapi_docs import AUTHENTICATED, keys, problems
from api.runs import run_reply
from api.services import Services
from api.wire import RunReply
from metering.db import raw_transaction
from metering.disputes import audit, service, timeline
from metering.keys import Principal, Scope
from metering.runs import find_run_id, get_run_view

T = TypeVar("T")
SUPPORT_KEYS = keys(Scope.SUPPORT, Scope.ADMIN)


class CreditRequest(msgspec.Struct, forbid_unknown_fields=True):
    """Exactly one of ``full``, ``amount_micros`` or ``percent`` (e.g. "12.5")."""

    reason: str
    full: bool = False
    amount_micros: int | None = None
    percent: str | None = None

    def credit(self) -> service.Credit:
        chosen = sum([self.full, self.amount_micros is not None, self.percent is not None])
        if chosen != 1:
            raise service.credit_choice_error()
        return service.Credit(self.full, self.amount_micros, self.percent)


class DisputeRequest(msgspec.Struct, forbid_unknown_fields=True):
    claim: str


class ReasonRequest(msgspec.Struct, forbid_unknown_fields=True):
    reason: str


class DisputeOpened(msgspec.Struct):
    dispute_id: int


async def _in_thread(
    request: Request[Any, Any, Any], state: State, work: Callable[[Services, Principal], T]
) -> T:
    services: Services = state.services
    principal = services.authenticate(request, Scope.SUPPORT, Scope.ADMIN)
    return await to_thread.run_sync(work, services, principal)


def _now() -> datetime:
    return datetime.now(UTC)


def _midnight(day: date | None) -> datetime | None:
    return datetime(day.year, day.month, day.day, tzinfo=UTC) if day else None


@get(
    "/v1/support/runs",
    tags=["support"],
    summary="Search runs; queue=true: held or disputed",
    security=SUPPORT_KEYS,
    responses=problems(*AUTHENTICATED, 422),
)
async def search_runs(
    request: Request[Any, Any, Any],
    state: State,
    customer: FromQuery[str | None] = None,
    outcome: FromQuery[str | None] = None,
    ended_from: FromQuery[date | None] = None,
    ended_to: FromQuery[date | None] = None,
    queue: FromQuery[bool] = False,
    q: FromQuery[str | None] = None,
    limit: FromQuery[int] = 100,
) -> list[timeline.RunSummary]:
    def work(services: Services, principal: Principal) -> list[timeline.RunSummary]:
        with raw_transaction(services.engine) as conn:
            return timeline.search_runs(
                conn,
                principal,
                customer=customer,
                outcome=outcome,
                ended_from=_midnight(ended_from),
                ended_to=_midnight(ended_to),
                queue=queue,
                text=q,
                limit=max(1, min(limit, 500)),
            )

    return await _in_thread(request, state, work)


@get(
    "/v1/support/runs/{run:str}",
    tags=["support"],
    summary="A run's full timeline",
    security=SUPPORT_KEYS,
    responses=problems(*AUTHENTICATED, 404),
)
async def run_timeline(
    request: Request[Any, Any, Any], run: FromPath[str], state: State
) -> timeline.Timeline:
    def work(services: Services, principal: Principal) -> timeline.Timeline:
        with raw_transaction(services.engine) as conn:
            return timeline.timeline(conn, principal, run)

    return await _in_thread(request, state, work)


@post(
    "/v1/support/runs/{run:str}/disputes",
    tags=["support"],
    summary="Open a dispute",
    security=SUPPORT_KEYS,
    responses=problems(*AUTHENTICATED, 404, 409, 413, 422),
)
async def open_dispute(
    request: Request[Any, Any, Any],
    run: FromPath[str],
    data: JSONBody[DisputeRequest],
    state: State,
) -> DisputeOpened:
    def work(services: Services, principal: Principal) -> DisputeOpened:
        with raw_transaction(services.engine) as conn:
            return DisputeOpened(service.open_dispute(conn, principal, run, data.claim))

    return await _in_thread(request, state, work)


@get(
    "/v1/support/disputes",
    tags=["support"],
    summary="Disputes, newest first",
    security=SUPPORT_KEYS,
    responses=problems(*AUTHENTICATED, 422),
)
async def list_disputes(
    request: Request[Any, Any, Any], state: State, status: FromQuery[str | None] = None
) -> list[timeline.Dispute]:
    def work(services: Services, principal: Principal) -> list[timeline.Dispute]:
        with raw_transaction(services.engine) as conn:
            return timeline.disputes(conn, principal, status=status)

    return await _in_thread(request, state, work)


def _run_of_dispute(services: Services, principal: Principal, dispute_id: int) -> RunReply:
    with raw_transaction(services.engine) as conn:
        subject = service.dispute_run_subject(conn, principal, dispute_id)
        return run_reply(get_run_view(conn, principal, subject))


@post(
    "/v1/support/disputes/{dispute_id:int}/approve",
    status_code=200,
    tags=["support"],
    summary="Approve a dispute with a full or partial credit",
    security=SUPPORT_KEYS,
    responses=problems(*AUTHENTICATED, 404, 409, 413, 422),
)
async def approve_dispute(
    request: Request[Any, Any, Any],
    dispute_id: FromPath[int],
    data: JSONBody[CreditRequest],
    state: State,
) -> RunReply:
    def work(services: Services, principal: Principal) -> RunReply:
        with raw_transaction(services.engine) as conn:
            service.approve_dispute(
                conn,
                principal,
                dispute_id,
                data.credit(),
                reason=data.reason,
                settings=services.settings,
                now=_now(),
            )
        return _run_of_dispute(services, principal, dispute_id)

    return await _in_thread(request, state, work)


@post(
    "/v1/support/disputes/{dispute_id:int}/reject",
    status_code=200,
    tags=["support"],
    summary="Reject a dispute with a reason the customer will see",
    security=SUPPORT_KEYS,
    responses=problems(*AUTHENTICATED, 404, 409, 413, 422),
)
async def reject_dispute(
    request: Request[Any, Any, Any],
    dispute_id: FromPath[int],
    data: JSONBody[ReasonRequest],
    state: State,
) -> RunReply:
    def work(services: Services, principal: Principal) -> RunReply:
        with raw_transaction(services.engine) as conn:
            service.reject_dispute(conn, principal, dispute_id, reason=data.reason, now=_now())
        return _run_of_dispute(services, principal, dispute_id)

    return await _in_thread(request, state, work)


@post(
    "/v1/support/runs/{run:str}/credit",
    status_code=200,
    tags=["support"],
    summary="Credit a run directly (also releases a hold)",
    security=SUPPORT_KEYS,
    responses=problems(*AUTHENTICATED, 404, 409, 413, 422),
)
async def credit_run(
    request: Request[Any, Any, Any], run: FromPath[str], data: JSONBody[CreditRequest], state: State
) -> RunReply:
    def work(services: Services, principal: Principal) -> RunReply:
        with raw_transaction(services.engine) as conn:
            run_id = find_run_id(conn, principal, run)
            service.grant_credit(
                conn,
                principal,
                run_id,
                data.credit(),
                reason=data.reason,
                settings=services.settings,
                now=_now(),
                action="run.credit",
            )
            return run_reply(get_run_view(conn, principal, run))

    return await _in_thread(request, state, work)


@post(
    "/v1/support/runs/{run:str}/release",
    status_code=200,
    tags=["support"],
    summary="Bill a held run as the policy proposed",
    security=SUPPORT_KEYS,
    responses=problems(*AUTHENTICATED, 404, 409, 413, 422),
)
async def release_run(
    request: Request[Any, Any, Any], run: FromPath[str], data: JSONBody[ReasonRequest], state: State
) -> RunReply:
    def work(services: Services, principal: Principal) -> RunReply:
        with raw_transaction(services.engine) as conn:
            service.release_hold(
                conn, principal, run, reason=data.reason, settings=services.settings, now=_now()
            )
            return run_reply(get_run_view(conn, principal, run))

    return await _in_thread(request, state, work)


@get(
    "/v1/support/audit",
    tags=["support"],
    summary="The audit log, newest first",
    security=SUPPORT_KEYS,
    responses=problems(*AUTHENTICATED),
)
async def audit_log(
    request: Request[Any, Any, Any], state: State, limit: FromQuery[int] = 200
) -> list[audit.AuditEntry]:
    def work(services: Services, principal: Principal) -> list[audit.AuditEntry]:
        with raw_transaction(services.engine) as conn:
            return audit.entries(conn, principal.tenant_id, limit=max(1, min(limit, 1000)))

    return await _in_thread(request, state, work)


SUPPORT_HANDLERS = [
    search_runs,
    run_timeline,
    open_dispute,
    list_disputes,
    approve_dispute,
    reject_dispute,
    credit_run,
    release_run,
    audit_log,
]
