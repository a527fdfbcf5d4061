"""The console's "What if…" page (admin keys): price a candidate policy over a month's
settled runs before it ships — totals and margin under the decisions in force and under
the candidate, the runs whose outcome would change, each customer, and the CSV.

It runs the same use case as ``POST /v1/policy/what-if`` (``metering.settlement.whatif.
what_if``: read-only, writes nothing) under the same bounds (api/heavy.py): one of the
tenant's what-if slots, shared with the API (a second one at once is refused on the form,
429), the what-if's time limit (503), cancelled when the browser goes, and replayed by the
worker processes, never in the API process. Running it is a POST with the session's CSRF
token, as every console form; support keys get a 403 page, as from the API.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from anyio import to_thread
from litestar import Request, Response, get, post
from litestar.datastructures import State

from api.console.pages import page_response
from api.console.policies import admin_console
from api.console.web import Console, Form, check_csrf, error_message, services_of
from api.console.whatif_form import KNOBS, SWITCHES, candidate_of, field_errors, form_of
from api.heavy import run_what_if
from api.policy_wire import csv_table, whatif_download
from api.services import Services
from metering.db import raw_transaction
from metering.errors import MeteringError
from metering.policies import versions
from metering.policies.defaults import settings_policy
from metering.settlement.replay import WhatIf

# The totals' rows: (label, Position attribute).
TOTALS = (
    ("Billed", "billed_micros"),
    ("Credited", "credited_micros"),
    ("Held for review", "held_micros"),
    ("Provider cost, all usage", "provider_cost_micros"),
    ("Provider cost, credited", "credited_provider_cost_micros"),
    ("Margin after protection", "margin_after_micros"),
)
# Refusals shown on the form, the candidate kept: a field at fault (422), the tenant's
# what-if slots all taken (429) and a what-if out of time (503), both worth a retry.
SHOWN_ON_FORM = frozenset({422, 429, 503})


def _page(
    request: Request[Any, Any, Any],
    console: Console,
    form: dict[str, str],
    *,
    report: WhatIf | None = None,
    error: MeteringError | None = None,
) -> Response[str]:
    response = page_response(
        request,
        "policy_whatif.html",
        console,
        nav="policies",
        form=form,
        knobs=KNOBS,
        switches=SWITCHES,
        report=report,
        totals=TOTALS,
        error=error_message(error) if error else None,
        errors=field_errors(error) if error else {},
    )
    if error is not None:
        response.status_code = error.status
        if "retry_after_s" in error.extra:
            response.headers["Retry-After"] = str(error.extra["retry_after_s"])
    return response


def _signed_in_admin(
    request: Request[Any, Any, Any], services: Services, form: dict[str, str]
) -> Console:
    console = admin_console(request, services)
    check_csrf(console, services, form)
    return console


async def _replay(
    request: Request[Any, Any, Any], services: Services, console: Console, form: dict[str, str]
) -> WhatIf:
    """The what-if of the form's candidate over its period, bounded as the API's; 422 for a
    field at fault (before a slot is taken), 429 when the tenant runs one already."""
    candidate = candidate_of(form)
    what = (form.get("period", "").strip(), candidate)
    return await run_what_if(request, services, console.principal.tenant_id, what, _as_is)


def _as_is(report: WhatIf) -> WhatIf:
    return report


@get("/policies/what-if", sync_to_thread=True)
def whatif_form(request: Request[Any, Any, Any], state: State) -> Response[str]:
    """The form, filled from the latest version, for the current month."""
    services = services_of(state)
    console = admin_console(request, services)
    with raw_transaction(services.engine) as conn:
        latest = versions.list_versions(
            conn, console.principal.tenant_id, settings_policy(services.settings)
        )[-1]
    period = datetime.now(UTC).strftime("%Y-%m")
    return _page(request, console, form_of(latest.document, period))


@post("/policies/what-if", status_code=200)
async def whatif_run(request: Request[Any, Any, Any], state: State, data: Form) -> Response[str]:
    """The replay of the form's candidate; a bad field, or a refusal worth a retry, re-shows
    the form with its error. Async: the request's disconnect cancels the replay."""
    services = services_of(state)
    console = await to_thread.run_sync(_signed_in_admin, request, services, data)
    try:
        report = await _replay(request, services, console, data)
    except MeteringError as exc:
        if exc.status not in SHOWN_ON_FORM:
            raise
        return _page(request, console, data, error=exc)
    return _page(request, console, data, report=report)


@post("/policies/what-if.csv", status_code=200)
async def whatif_csv(request: Request[Any, Any, Any], state: State, data: Form) -> Response[str]:
    """The same replay as the API's CSV: the customers, or (``table=changes``) the changes."""
    services = services_of(state)
    console = await to_thread.run_sync(_signed_in_admin, request, services, data)
    table = csv_table(data.get("table", "customers"))
    return whatif_download(await _replay(request, services, console, data), table)
