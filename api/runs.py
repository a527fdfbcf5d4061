"""GET /v1/runs/{run} — a run's live status and money."""

from __future__ import annotations

from typing import Any

from litestar import Request, get
from litestar.datastructures import State
from litestar.params import FromPath

from api.services import Services
from api.wire import RunReply
from metering.db import raw_transaction
from metering.keys import Scope
from metering.runs import get_run_view


@get("/v1/runs/{run:str}", sync_to_thread=True, summary="A run's status", tags=["runs"])
def get_run(request: Request[Any, Any, Any], run: FromPath[str], state: State) -> RunReply:
    services: Services = state.services
    principal = services.authenticate(
        request, Scope.INGEST, Scope.SUPPORT, Scope.ADMIN, Scope.CUSTOMER
    )
    with raw_transaction(services.engine) as conn:
        view = get_run_view(conn, principal, run)
    return RunReply(
        run=view.run,
        customer=view.customer,
        status=view.status,
        outcome=view.outcome,
        gross_micros=view.gross_micros,
        billed_micros=view.billed_micros,
        credited_micros=view.credited_micros,
        rule_ids=view.rule_ids,
        explanation=view.explanation,
        decisions=view.decisions,
        event_count=view.event_count,
        event_counts=view.event_counts,
        attempts=view.attempts,
        first_event_at=view.first_event_at,
        last_event_at=view.last_event_at,
        last_received_at=view.last_received_at,
        terminal_at=view.terminal_at,
    )
