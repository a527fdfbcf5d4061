"""Wire types of /v1/webhooks: what admins send and get back. Never table rows."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import msgspec

from metering.webhooks.endpoints import EndpointView
from metering.webhooks.log import DeliveryPage, DeliveryView

EventTypes = Annotated[
    list[str],
    msgspec.Meta(description="Event types to send (docs/webhooks.md); empty: every type."),
]


class EndpointCreate(msgspec.Struct, forbid_unknown_fields=True):
    url: Annotated[
        str, msgspec.Meta(description="https:// URL of a public address that receives them.")
    ]
    event_types: EventTypes = msgspec.field(default_factory=list)
    description: str = ""
    enabled: bool = True


class EndpointUpdate(msgspec.Struct, forbid_unknown_fields=True):
    """Only the fields given change. Enabling a disabled endpoint resumes its messages."""

    url: str | None = None
    event_types: EventTypes | None = None
    description: str | None = None
    enabled: bool | None = None


class EndpointReply(msgspec.Struct):
    id: str
    url: str
    event_types: list[str]
    description: str
    enabled: bool
    # Why and when it was disabled: by an admin, or after failing for days.
    disabled_reason: str | None
    disabled_at: datetime | None
    created_at: datetime
    updated_at: datetime
    # Until when the secret replaced by the last rotation still signs beside the new one.
    previous_secret_expires_at: datetime | None


class EndpointCreated(EndpointReply):
    """The endpoint and its signing secret, shown this once."""

    secret: str


class SecretRotated(msgspec.Struct):
    id: str
    secret: str  # the new one, shown this once
    previous_secret_expires_at: datetime | None


class AttemptReply(msgspec.Struct):
    attempt: int
    outcome: str
    started_at: datetime
    status_code: int | None
    latency_ms: int
    response_excerpt: str | None
    error: str | None  # why no answer came: refused address, timeout, connection error


class DeliveryReply(msgspec.Struct):
    message_id: str  # the webhook-id header
    type: str
    run: str | None
    status: str  # pending, delivered or failed
    attempt_count: int
    next_attempt_at: datetime | None
    created_at: datetime
    finished_at: datetime | None
    attempts: list[AttemptReply]


class DeliveryPageReply(msgspec.Struct):
    deliveries: list[DeliveryReply]
    next_cursor: str | None


class RedeliverSince(msgspec.Struct, forbid_unknown_fields=True):
    # A string, parsed by the handler: Litestar's lax decoding would take a number as a
    # Unix time, which the schema does not promise.
    since: Annotated[
        str,
        msgspec.Meta(
            description="RFC 3339 with a time zone, e.g. 2026-12-01T12:00:00Z.",
            extra_json_schema={"format": "date-time"},
        ),
    ]


class Requeued(msgspec.Struct):
    requeued: int


def endpoint_reply(view: EndpointView) -> EndpointReply:
    return msgspec.convert(view, EndpointReply, from_attributes=True)


def endpoint_created(view: EndpointView, secret: str) -> EndpointCreated:
    return EndpointCreated(**msgspec.structs.asdict(endpoint_reply(view)), secret=secret)


def delivery_reply(view: DeliveryView) -> DeliveryReply:
    return msgspec.convert(view, DeliveryReply, from_attributes=True)


def delivery_page_reply(page: DeliveryPage) -> DeliveryPageReply:
    return msgspec.convert(page, DeliveryPageReply, from_attributes=True)
