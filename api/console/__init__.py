"""The support console at ``/console``: server-rendered pages on the same Litestar app.

Signed in with a support or admin key (a signed session cookie, never the key itself);
every form carries a CSRF token bound to the session. See ``session`` for the design.
"""

from __future__ import annotations

from litestar import Router
from litestar.exceptions import HTTPException

from api.console import actions, pages, policies, protection, webhooks, whatif
from api.console.web import (
    CsrfRejected,
    NotSignedIn,
    client_error_handler,
    csrf_handler,
    metering_error_handler,
    not_signed_in_handler,
)
from metering.errors import MeteringError

console_router = Router(
    "/console",
    route_handlers=[
        pages.login_page,
        pages.login,
        pages.logout,
        pages.queue_page,
        pages.run_page,
        pages.audit_page,
        actions.open_dispute,
        actions.approve_dispute,
        actions.reject_dispute,
        actions.release_hold,
        actions.credit_run,
        actions.statement_link,
        webhooks.endpoints_page,
        webhooks.endpoint_page,
        webhooks.redeliver_message,
        webhooks.redeliver_since,
        protection.protection_page,
        protection.protection_csv,
        policies.policies_page,
        whatif.whatif_form,
        whatif.whatif_run,
        whatif.whatif_csv,
    ],
    exception_handlers={
        NotSignedIn: not_signed_in_handler,
        CsrfRejected: csrf_handler,
        MeteringError: metering_error_handler,
        HTTPException: client_error_handler,
    },
    include_in_schema=False,
)

__all__ = ["console_router"]
