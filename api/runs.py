"""GET /v1/runs/{run} — a run's status and money; POST …/settle for support."""

from __future__ import annotations

from typing import Any

from anyio import to_thread
from litestar import Request, get, post
from litestar.datastructures import State
from litestar.params import FromPath

from api.openapi_docs import AUTHENTICATED, keys, problems
from api.services import Services
from api.wire import DecisionReply, RunReply
from metering.db import raw_transaction
from metering.keys import Principal, Scope
from metering.runs import DecisionView, RunView, find_run_id, get_run_view
from metering.settlement.runner import now_utc
from metering.settlement.settle import settle_runs


def run_reply(view: RunView) -> RunReply:
    return RunReply(
        run=view.run,
        customer=view.customer,
        status=view.status,
        outcome=view.outcome,
        gross_micros=view.gross_micros,
        billed_micros=view.billed_micros,
        credited_micros=view.credited_micros,
        held_micros=view.held_micros,
        tentative_micros=view.tentative_micros,
        rule_ids=view.rule_ids,
        explanation=view.explanation,
        decisions=[_decision(d) for d in view.decisions],
        event_count=view.event_count,
        event_counts=view.event_counts,
        attempts=view.attempts,
        first_event_at=view.first_event_at,
        last_event_at=view.last_event_at,
        last_received_at=view.last_received_at,
        terminal_at=view.terminal_at,
        settled=view.settled,
        reopened=view.reopened,
    )


def _decision(d: DecisionView) -> DecisionReply:
    return DecisionReply(
        version=d.version,
        origin=d.origin,
        outcome=d.outcome,
        status=d.status,
        gross_micros=d.gross_micros,
        billed_micros=d.billed_micros,
        credited_micros=d.credited_micros,
        rule_ids=list(d.rule_ids),
        evidence_event_ids=list(d.evidence_event_ids),
        explanation=d.explanation,
        period=d.period,
        decided_at=d.decided_at,
    )


@get(
    "/v1/runs/{run:str}",
    sync_to_thread=True,
    summary="A run's status",
    tags=["runs"],
    security=keys(Scope.INGEST, Scope.SUPPORT, Scope.ADMIN, Scope.CUSTOMER),
    responses=problems(*AUTHENTICATED, 404),
)
def get_run(request: Request[Any, Any, Any], run: FromPath[str], state: State) -> RunReply:
    services: Services = state.services
    principal = services.authenticate(
        request, Scope.INGEST, Scope.SUPPORT, Scope.ADMIN, Scope.CUSTOMER
    )
    with raw_transaction(services.engine) as conn:
        return run_reply(get_run_view(conn, principal, run))


@post(
    "/v1/support/runs/{run:str}/settle",
    status_code=200,
    summary="Settle a run now, as if every window had passed",
    tags=["support"],
    security=keys(Scope.SUPPORT, Scope.ADMIN),
    responses=problems(*AUTHENTICATED, 404, 409),
)
async def settle_run_now(
    request: Request[Any, Any, Any], run: FromPath[str], state: State
) -> RunReply:
    services: Services = state.services
    principal = services.authenticate(request, Scope.SUPPORT, Scope.ADMIN)
    return await to_thread.run_sync(_settle_now, services, principal, run)


def _settle_now(services: Services, principal: Principal, subject: str) -> RunReply:
    with raw_transaction(services.engine) as conn:
        run_id = find_run_id(conn, principal, subject)
        settle_runs(conn, [run_id], now=now_utc(), settings=services.settings, force=True)
    with raw_transaction(services.engine) as conn:
        return run_reply(get_run_view(conn, principal, subject))
