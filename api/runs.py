"""GET /v1/runs/{run} — a run's status and money; POST …/settle for support."""

from __future__ import annotations

from typing import Any

import msgspec
from anyio import to_thread
from litestar import Request, get, post
from litestar.datastructures import State
from litestar.params import FromPath

from api.openapi_docs import AUTHENTICATED, keys, problems
from api.services import Services
from api.wire import RunReply
from metering.db import raw_transaction
from metering.keys import Principal, Scope
from metering.runs import RunView, find_run_id, get_run_view, run_document
from metering.settlement.runner import now_utc
from metering.settlement.settle import settle_runs


def run_reply(view: RunView) -> RunReply:
    """The wire type of ``run_document``, the one definition of a run's JSON shape."""
    return msgspec.convert(run_document(view), RunReply)


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
