"""Stripe's two event destinations, each with its own signing secret: POST /webhooks/stripe
(snapshot events: invoices, credit notes) and POST /webhooks/stripe/thin (thin events: meter
error reports). Verified, stored in the inbox, handled by a task."""

from __future__ import annotations

from typing import Any

from anyio import to_thread
from litestar import Request, post
from litestar.datastructures import State

from api.openapi_docs import StripeWebhookOperation, problems
from api.services import Services
from metering.billing import webhooks
from metering.db import raw_transaction
from metering.errors import MeteringError, bad_request


@post(
    "/webhooks/stripe",
    status_code=200,
    tags=["stripe"],
    summary="Stripe webhook endpoint (authenticated by the Stripe-Signature header)",
    responses=problems(400, 404, 413, 429, 503),
    operation_class=StripeWebhookOperation,
)
async def stripe_webhook(request: Request[Any, Any, Any], state: State) -> dict[str, Any]:
    payload = await request.body()
    signature = request.headers.get("stripe-signature")
    return await to_thread.run_sync(_receive, state.services, payload, signature, False)


@post(
    "/webhooks/stripe/thin",
    status_code=200,
    tags=["stripe"],
    summary="Stripe thin-event destination (authenticated by the Stripe-Signature header)",
    responses=problems(400, 404, 413, 429, 503),
    operation_class=StripeWebhookOperation,
)
async def stripe_thin_webhook(request: Request[Any, Any, Any], state: State) -> dict[str, Any]:
    payload = await request.body()
    signature = request.headers.get("stripe-signature")
    return await to_thread.run_sync(_receive, state.services, payload, signature, True)


def _receive(
    services: Services, payload: bytes, signature: str | None, thin: bool
) -> dict[str, Any]:
    settings = services.settings
    secret = settings.stripe_thin_webhook_secret if thin else settings.stripe_webhook_secret
    if not signature:  # unsigned is a bad request whether or not this destination is set up
        raise bad_request("the Stripe-Signature header is missing", code="signature_missing")
    if not secret:
        raise MeteringError(
            "webhooks are not configured", code="webhooks_disabled", status=404, title="Not found"
        )
    event = webhooks.verify(
        payload, signature, secret, settings.stripe_webhook_tolerance_s, thin=thin
    )
    with raw_transaction(services.engine) as conn:
        new = webhooks.store(conn, event)
    return {"received": True, "duplicate": not new}
