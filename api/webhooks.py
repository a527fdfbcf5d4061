"""/v1/webhooks — a tenant's webhook endpoints, their delivery log and redelivery (admin)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from litestar import Request, delete, get, patch, post
from litestar.datastructures import State
from litestar.params import FromPath, FromQuery, JSONBody

from api.admin import as_admin, rfc3339, shared_options
from api.openapi_docs import AUTHENTICATED, keys, problems
from api.services import Services
from api.webhook_wire import (
    DeliveryPageReply,
    DeliveryReply,
    EndpointCreate,
    EndpointCreated,
    EndpointReply,
    EndpointUpdate,
    RedeliverSince,
    Requeued,
    SecretRotated,
    delivery_page_reply,
    delivery_reply,
    endpoint_created,
    endpoint_reply,
)
from metering.db import raw_transaction
from metering.keys import Principal, Scope
from metering.webhooks import endpoints, log

ADMIN = keys(Scope.ADMIN)
ENDPOINT = "/v1/webhooks/endpoints/{endpoint_id:str}"


def _now() -> datetime:
    return datetime.now(UTC)


@post(
    "/v1/webhooks/endpoints",
    status_code=201,
    tags=["webhooks"],
    summary="Add a webhook endpoint; its signing secret is in this reply only",
    security=ADMIN,
    responses=problems(*AUTHENTICATED, 409, 413, 422),
)
async def create_endpoint(
    request: Request[Any, Any, Any], data: JSONBody[EndpointCreate], state: State
) -> EndpointCreated:
    spec = endpoints.EndpointSpec(data.url, data.event_types, data.description, data.enabled)

    def work(services: Services, principal: Principal) -> EndpointCreated:
        with raw_transaction(services.engine) as conn:
            view, secret = endpoints.create_endpoint(conn, principal, spec, services.settings)
        return endpoint_created(view, secret)

    return await as_admin(request, state, work)


@get(
    "/v1/webhooks/endpoints",
    tags=["webhooks"],
    summary="The tenant's webhook endpoints",
    security=ADMIN,
    responses=problems(*AUTHENTICATED),
)
async def list_endpoints(request: Request[Any, Any, Any], state: State) -> list[EndpointReply]:
    def work(services: Services, principal: Principal) -> list[EndpointReply]:
        with raw_transaction(services.engine) as conn:
            return [endpoint_reply(v) for v in endpoints.list_endpoints(conn, principal)]

    return await as_admin(request, state, work)


@get(
    ENDPOINT,
    tags=["webhooks"],
    summary="A webhook endpoint, with why it is disabled if it is",
    security=ADMIN,
    responses=problems(*AUTHENTICATED, 404),
)
async def get_endpoint(
    request: Request[Any, Any, Any], endpoint_id: FromPath[str], state: State
) -> EndpointReply:
    def work(services: Services, principal: Principal) -> EndpointReply:
        with raw_transaction(services.engine) as conn:
            return endpoint_reply(endpoints.get_endpoint(conn, principal, endpoint_id))

    return await as_admin(request, state, work)


@patch(
    ENDPOINT,
    tags=["webhooks"],
    summary="Change a webhook endpoint (only the fields given)",
    security=ADMIN,
    responses=problems(*AUTHENTICATED, 404, 413, 422),
)
async def update_endpoint(
    request: Request[Any, Any, Any],
    endpoint_id: FromPath[str],
    data: JSONBody[EndpointUpdate],
    state: State,
) -> EndpointReply:
    change = endpoints.EndpointChange(data.url, data.event_types, data.description, data.enabled)

    def work(services: Services, principal: Principal) -> EndpointReply:
        with raw_transaction(services.engine) as conn:
            view = endpoints.update_endpoint(
                conn, principal, endpoint_id, change, services.settings
            )
        return endpoint_reply(view)

    return await as_admin(request, state, work)


@delete(
    ENDPOINT,
    tags=["webhooks"],
    summary="Delete a webhook endpoint with its delivery log",
    security=ADMIN,
    responses=problems(*AUTHENTICATED, 404),
)
async def delete_endpoint(
    request: Request[Any, Any, Any], endpoint_id: FromPath[str], state: State
) -> None:
    def work(services: Services, principal: Principal) -> None:
        with raw_transaction(services.engine) as conn:
            endpoints.delete_endpoint(conn, principal, endpoint_id)

    await as_admin(request, state, work)


@post(
    ENDPOINT + "/rotate-secret",
    status_code=200,
    tags=["webhooks"],
    summary="A new signing secret; the old one keeps signing beside it for 24 h",
    security=ADMIN,
    responses=problems(*AUTHENTICATED, 404),
)
async def rotate_secret(
    request: Request[Any, Any, Any], endpoint_id: FromPath[str], state: State
) -> SecretRotated:
    def work(services: Services, principal: Principal) -> SecretRotated:
        with raw_transaction(services.engine) as conn:
            view, secret = endpoints.rotate_secret(
                conn, principal, endpoint_id, services.settings, _now()
            )
        return SecretRotated(view.id, secret, view.previous_secret_expires_at)

    return await as_admin(request, state, work)


@get(
    ENDPOINT + "/deliveries",
    tags=["webhooks"],
    summary="The endpoint's delivery log, newest first: every attempt's answer",
    security=ADMIN,
    responses=problems(*AUTHENTICATED, 404, 422),
)
async def list_deliveries(
    request: Request[Any, Any, Any],
    endpoint_id: FromPath[str],
    state: State,
    status: FromQuery[str | None] = None,
    cursor: FromQuery[str | None] = None,
    limit: FromQuery[int] = 50,
) -> DeliveryPageReply:
    def work(services: Services, principal: Principal) -> DeliveryPageReply:
        with raw_transaction(services.engine) as conn:
            page = log.deliveries(
                conn, principal, endpoint_id, status=status, cursor=cursor, limit=limit
            )
        return delivery_page_reply(page)

    return await as_admin(request, state, work)


@post(
    "/v1/webhooks/messages/{message_id:str}/redeliver",
    status_code=202,
    tags=["webhooks"],
    summary="Send a message again (same webhook-id, same body)",
    security=ADMIN,
    responses=problems(*AUTHENTICATED, 404, 409),
)
async def redeliver_message(
    request: Request[Any, Any, Any], message_id: FromPath[str], state: State
) -> DeliveryReply:
    def work(services: Services, principal: Principal) -> DeliveryReply:
        with raw_transaction(services.engine) as conn:
            view = log.redeliver_message(conn, principal, message_id, _now())
        return delivery_reply(view)

    return await as_admin(request, state, work)


@post(
    ENDPOINT + "/redeliver",
    status_code=202,
    tags=["webhooks"],
    summary="Send again every message the endpoint was given since a time",
    security=ADMIN,
    responses=problems(*AUTHENTICATED, 404, 409, 413, 422),
)
async def redeliver_since(
    request: Request[Any, Any, Any],
    endpoint_id: FromPath[str],
    data: JSONBody[RedeliverSince],
    state: State,
) -> Requeued:
    def work(services: Services, principal: Principal) -> Requeued:
        since = rfc3339(data.since, "$.since")
        with raw_transaction(services.engine) as conn:
            count = log.redeliver_since(conn, principal, endpoint_id, since, _now())
        return Requeued(count)

    return await as_admin(request, state, work)


WEBHOOK_HANDLERS = [
    shared_options("/v1/webhooks/endpoints"),
    shared_options(ENDPOINT),
    create_endpoint,
    list_endpoints,
    get_endpoint,
    update_endpoint,
    delete_endpoint,
    rotate_secret,
    list_deliveries,
    redeliver_message,
    redeliver_since,
]
