"""GET /v1/reports/protection — what protection credited and what it cost (admin; JSON, CSV).

A thin edge: the use case (``metering.protection.service``) checks the key and reads the
key's own tenant; this module only picks the format and writes it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import msgspec
from anyio import to_thread
from litestar import Request, Response, get
from litestar.datastructures import State
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import FromQuery

from api.downloads import csv_download, wants_csv
from api.openapi_docs import AUTHENTICATED, keys, problems
from api.services import Services
from api.wire import InvoiceTotalsReply
from metering.db import raw_transaction
from metering.keys import Principal, Scope
from metering.protection.export import report_csv, report_document
from metering.protection.report import ProtectionReport
from metering.protection.service import report_for


class FiguresReply(msgspec.Struct):
    """Integer micro-USD. ``gross = billed + credited + held``; ``credited`` is the sum of
    ``credited_by_rule`` (R1–R5, ``support``, and ``other``: credited lines no rule names
    any more); ``credited_provider_cost_by_rule`` splits the provider cost of the credited
    usage the same way. Margins: before protection ``gross − provider_cost``, after it
    ``billed − provider_cost``."""

    runs: int
    gross_micros: int
    billed_micros: int
    held_micros: int
    credited_micros: int
    credited_by_rule: dict[str, int]
    provider_cost_micros: int
    credited_provider_cost_micros: int
    credited_provider_cost_by_rule: dict[str, int]
    margin_before_micros: int
    margin_after_micros: int
    uncosted_lines: int
    uncosted_gross_micros: int


class CustomerFiguresReply(FiguresReply):
    customer: str
    invoice: InvoiceTotalsReply | None = None  # billed and credited in its billing currency
    invoice_note: str | None = None  # why ``invoice`` is null


class ProtectionReply(msgspec.Struct):
    tenant: str
    period: str
    currency: str
    rules: dict[str, str]
    total: FiguresReply
    customers: list[CustomerFiguresReply]
    top_by_restored_cost: list[CustomerFiguresReply]


@get(
    "/v1/reports/protection",
    summary="The cost of protection in a month: credits by rule, provider cost, margins",
    tags=["reports"],
    security=keys(Scope.ADMIN),
    responses={
        200: ResponseSpec(ProtectionReply, description="JSON; text/csv with format=csv"),
        **problems(*AUTHENTICATED, 422),
    },
)
async def get_protection_report(
    request: Request[Any, Any, Any],
    state: State,
    period: FromQuery[str] = "current",
    format: FromQuery[str] = "json",
) -> Response[Any]:
    """JSON by default; CSV for ``format=csv`` or ``Accept: text/csv``."""
    services: Services = state.services
    principal = services.authenticate(request, Scope.ADMIN)
    as_csv = wants_csv(request, format)
    report = await to_thread.run_sync(_report, services, principal, period)
    if as_csv:
        return csv_download(report_csv(report), f"protection-{report.period}.csv")
    return Response(msgspec.convert(report_document(report), ProtectionReply))


def _report(services: Services, principal: Principal, period: str) -> ProtectionReport:
    with raw_transaction(services.engine) as conn:
        return report_for(
            conn,
            principal,
            period,
            datetime.now(UTC),
            unit_micros=services.settings.stripe_meter_unit_micros,
        )
