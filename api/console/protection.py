"""The console's cost of protection page (admin keys): a month's credits by rule, what
they cost in provider spend, margins, customers, and the CSV.

Both routes call the same use case as ``GET /v1/reports/protection``
(``metering.protection.service.report_for``), so a support key gets the same 403 and
always the key's own tenant.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from litestar import Request, Response, get
from litestar.datastructures import State
from litestar.params import FromQuery

from api.console.pages import page_response
from api.console.protection_svg import credited_by_rule_svg
from api.console.web import services_of, signed_in
from api.downloads import csv_download
from metering.db import raw_transaction
from metering.keys import Principal
from metering.protection.export import CURRENCY_UNKNOWN, report_csv
from metering.protection.report import CREDIT_KINDS, RULE_NAMES, ProtectionReport
from metering.protection.service import report_for


def _report(state: State, principal: Principal, period: str | None) -> ProtectionReport:
    services = services_of(state)
    with raw_transaction(services.engine) as conn:
        return report_for(
            conn,
            principal,
            period or "current",
            datetime.now(UTC),
            unit_micros=services.settings.stripe_meter_unit_micros,
        )


@get("/protection", sync_to_thread=True)
def protection_page(
    request: Request[Any, Any, Any], state: State, period: FromQuery[str | None] = None
) -> Response[str]:
    console = signed_in(request, services_of(state))
    report = _report(state, console.principal, period)
    return page_response(
        request,
        "protection.html",
        console,
        nav="protection",
        report=report,
        chart=credited_by_rule_svg(report.total),
        kinds=[k for k in CREDIT_KINDS if k != "other" or report.total.by_rule()[k]],
        rule_names=RULE_NAMES,
        currency_unknown=CURRENCY_UNKNOWN,
    )


@get("/protection.csv", sync_to_thread=True)
def protection_csv(
    request: Request[Any, Any, Any], state: State, period: FromQuery[str | None] = None
) -> Response[str]:
    console = signed_in(request, services_of(state))
    report = _report(state, console.principal, period)
    return csv_download(report_csv(report), f"protection-{report.period}.csv")
