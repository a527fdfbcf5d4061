"""The console's policy page (admin keys): the tenant's protection policy versions, which
one is in force, and what each changed from the one before.

Read-only: versions are written through ``/v1/policies`` or ``fairmeter policy set``. It
reads through the same use cases (``metering.policies.versions``); support keys get a 403
page and see no nav entry.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from litestar import Request, Response, get
from litestar.datastructures import State

from api.console.pages import page_response
from api.console.web import Console, services_of, signed_in
from api.services import Services
from metering.db import raw_transaction
from metering.errors import forbidden
from metering.keys import Scope
from metering.policies import versions
from metering.policies.defaults import settings_policy
from metering.policy.document import diff_policies


def _state(version: versions.PolicyVersion, current: int, now: datetime) -> str:
    if version.withdrawn is not None:
        return "withdrawn"
    if version.version == current:
        return "in force"
    if version.effective_from is not None and version.effective_from > now:
        return "scheduled"
    return "superseded"


def _counted_before(
    found: list[versions.PolicyVersion], index: int
) -> versions.PolicyVersion | None:
    """The version ``found[index]`` follows in force: the latest earlier one not withdrawn.
    A withdrawn version was never in force, so what a version changes is read against the
    one it actually replaces (comparing with the withdrawn one showed changes nobody had)."""
    return next((v for v in reversed(found[:index]) if v.withdrawn is None), None)


def admin_console(request: Request[Any, Any, Any], services: Services) -> Console:
    """The signed-in console user, if an admin: policies are, as ``/v1/policies``; a
    support key gets a 403 page."""
    console = signed_in(request, services)
    if console.principal.scope is not Scope.ADMIN:
        raise forbidden("the tenant's policies are for admin keys")
    return console


@get("/policies", sync_to_thread=True)
def policies_page(request: Request[Any, Any, Any], state: State) -> Response[str]:
    services = services_of(state)
    console = admin_console(request, services)
    with raw_transaction(services.engine) as conn:
        found = versions.list_versions(
            conn, console.principal.tenant_id, settings_policy(services.settings), withdrawn=True
        )
    now = datetime.now(UTC)
    current = versions.in_force_at(found, now)
    rows = []
    for i, v in enumerate(found):
        before = _counted_before(found, i)
        rows.append(
            {
                "version": v,
                "in_force": v.version == current,
                "state": _state(v, current, now),
                "changes": diff_policies(before.document, v.document) if before else [],
                "since": before.version if before else None,
                "document": v.document.as_json(),
            }
        )
    return page_response(
        request, "policies.html", console, nav="policies", rows=list(reversed(rows))
    )
