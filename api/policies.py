"""/v1/policies — a tenant's protection policy versions: write, withdraw, list, read, diff
(admin)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from litestar import Request, Response, get, post
from litestar.datastructures import State
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import FromPath, FromQuery, JSONBody, QueryParameter

from api.admin import as_admin, rfc3339, shared_options
from api.downloads import wants_csv
from api.heavy import run_what_if
from api.openapi_docs import AUTHENTICATED, keys, problems
from api.policy_wire import (
    PolicyChange,
    PolicyCreate,
    PolicyDiffReply,
    PolicyReply,
    PolicyWithdraw,
    WhatIfReply,
    WhatIfRequest,
    csv_table,
    policy_reply,
    whatif_download,
    whatif_reply,
)
from api.services import Services
from metering.db import raw_transaction
from metering.errors import not_found
from metering.keys import Principal, Scope
from metering.policies import versions
from metering.policies.defaults import settings_policy
from metering.policies.withdrawals import withdraw_version
from metering.settlement.replay import WhatIf

ADMIN = keys(Scope.ADMIN)
MAX_VERSION = 2**31 - 1  # the column is an INTEGER


def _now() -> datetime:
    return datetime.now(UTC)


def _known(version: int) -> int:
    if not 0 <= version <= MAX_VERSION:
        raise not_found(f"no policy version {version}", code="policy_version_not_found")
    return version


@post(
    "/v1/policies",
    status_code=201,
    tags=["policies"],
    summary="Write the tenant's next policy version (fields left out keep the latest's)",
    security=ADMIN,
    responses=problems(*AUTHENTICATED, 409, 413, 422),
)
async def create_policy(
    request: Request[Any, Any, Any], data: JSONBody[PolicyCreate], state: State
) -> PolicyReply:
    def work(services: Services, principal: Principal) -> PolicyReply:
        # Read after the key is checked: a request without one is 401, whatever its body.
        start = (
            None
            if data.effective_from is None
            else rfc3339(data.effective_from, "$.effective_from")
        )
        settings = services.settings
        with raw_transaction(services.engine) as conn:
            # The clock is read once the tenant's lock is held (lock before clock).
            made = versions.create_version(
                conn,
                principal.tenant_id,
                data.document,
                created_by=principal.key_id,
                defaults=settings_policy(settings),
                effective_from=start,
                note=data.note,
                max_lead_s=settings.policy_max_lead_s,
                wait_s=settings.policy_write_wait_s,
            )
        started = start is None or start <= _now()  # sent: the version starts then
        return policy_reply(made, in_force=started)

    return await as_admin(request, state, work)


@post(
    "/v1/policies/{version:int}/withdraw",
    status_code=200,
    tags=["policies"],
    summary="Withdraw a version that has not taken effect; it is then never in force",
    security=ADMIN,
    responses=problems(*AUTHENTICATED, 404, 409, 413, 422),
)
async def withdraw_policy(
    request: Request[Any, Any, Any],
    version: FromPath[int],
    state: State,
    data: JSONBody[PolicyWithdraw],
) -> PolicyReply:
    """200 with the version, withdrawn; the same reply again for a version already
    withdrawn. 409 ``policy_version_in_force`` once it has taken effect."""

    def work(services: Services, principal: Principal) -> PolicyReply:
        with raw_transaction(services.engine) as conn:
            withdrawn = withdraw_version(
                conn,
                principal.tenant_id,
                _known(version),
                withdrawn_by=principal.key_id,
                defaults=settings_policy(services.settings),
                reason=data.reason,
                wait_s=services.settings.policy_write_wait_s,
            )
        return policy_reply(withdrawn, in_force=False)

    return await as_admin(request, state, work)


@get(
    "/v1/policies",
    tags=["policies"],
    summary="Every version of the tenant's policy, version 0 (the settings) first",
    security=ADMIN,
    responses=problems(*AUTHENTICATED),
)
async def list_policies(request: Request[Any, Any, Any], state: State) -> list[PolicyReply]:
    def work(services: Services, principal: Principal) -> list[PolicyReply]:
        defaults = settings_policy(services.settings)
        with raw_transaction(services.engine) as conn:
            found = versions.list_versions(conn, principal.tenant_id, defaults, withdrawn=True)
        current = versions.in_force_at(found, _now())
        return [policy_reply(v, in_force=v.version == current) for v in found]

    return await as_admin(request, state, work)


@get(
    "/v1/policies/diff",
    tags=["policies"],
    summary="What changed between two versions (default: the latest and the one before)",
    security=ADMIN,
    responses=problems(*AUTHENTICATED, 404),
)
async def diff_policies(
    request: Request[Any, Any, Any],
    state: State,
    from_version: Annotated[int | None, QueryParameter(name="from")] = None,
    to_version: Annotated[int | None, QueryParameter(name="to")] = None,
) -> PolicyDiffReply:
    def work(services: Services, principal: Principal) -> PolicyDiffReply:
        defaults = settings_policy(services.settings)
        with raw_transaction(services.engine) as conn:
            new = to_version
            if new is None:
                new = versions.list_versions(conn, principal.tenant_id, defaults)[-1].version
            old = max(new - 1, 0) if from_version is None else from_version
            changes = versions.diff_versions(
                conn, principal.tenant_id, _known(old), _known(new), defaults
            )
        return PolicyDiffReply(old, new, [PolicyChange(*change) for change in changes])

    return await as_admin(request, state, work)


@get(
    "/v1/policies/{version:int}",
    tags=["policies"],
    summary="One version of the tenant's policy (0: the deployment's settings)",
    security=ADMIN,
    responses=problems(*AUTHENTICATED, 404),
)
async def get_policy(
    request: Request[Any, Any, Any], version: FromPath[int], state: State
) -> PolicyReply:
    def work(services: Services, principal: Principal) -> PolicyReply:
        defaults = settings_policy(services.settings)
        with raw_transaction(services.engine) as conn:
            found = versions.list_versions(conn, principal.tenant_id, defaults, withdrawn=True)
        current = versions.in_force_at(found, _now())
        wanted = [v for v in found if v.version == _known(version)]
        if not wanted:
            raise not_found(f"no policy version {version}", code="policy_version_not_found")
        return policy_reply(wanted[0], in_force=version == current)

    return await as_admin(request, state, work)


@post(
    "/v1/policy/what-if",
    status_code=200,
    tags=["policies"],
    summary="Replay a period's settled runs under a candidate policy; writes nothing",
    security=ADMIN,
    responses={
        200: ResponseSpec(
            WhatIfReply,
            description="JSON; text/csv with format=csv (table=changes: the outcome changes)",
        ),
        **problems(*AUTHENTICATED, 413, 422),
    },
)
async def policy_what_if(
    request: Request[Any, Any, Any],
    data: JSONBody[WhatIfRequest],
    state: State,
    format: FromQuery[str] = "json",
    table: FromQuery[str] = "customers",
) -> Response[Any]:
    """JSON by default; CSV (docs/policies.md) for ``format=csv`` or ``Accept: text/csv``:
    a row per customer and a total row, or with ``table=changes`` the outcome changes."""

    services: Services = state.services
    principal = services.authenticate(request, Scope.ADMIN)
    as_csv = wants_csv(request, format)
    chosen = csv_table(table)

    def render(report: WhatIf) -> Response[Any]:
        if as_csv:
            return whatif_download(report, chosen)
        return Response(whatif_reply(report))

    what = (data.period, data.document)
    return await run_what_if(request, services, principal.tenant_id, what, render)


POLICY_HANDLERS = [
    shared_options("/v1/policies"),
    create_policy,
    withdraw_policy,
    list_policies,
    diff_policies,
    get_policy,
    policy_what_if,
]
