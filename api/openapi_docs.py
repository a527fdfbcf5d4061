"""What the OpenAPI document says about keys, errors and the ingest body.

Documentation only: nothing here changes what a handler accepts or answers. Every handler
names the scopes it accepts (``keys``) and the problem responses it can give (``problems``),
so that clients, Schemathesis and the IDOR matrix in ``tests/security`` read one truth.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

# Litestar's own struct schema plugin keeps its handling of msgspec fields; ours only adds
# what it leaves out (``additionalProperties: false`` for strict structs).
from litestar._openapi.schema_generation.plugins.struct import StructSchemaPlugin
from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.spec import (
    Components,
    OpenAPIFormat,
    OpenAPIMediaType,
    OpenAPIResponse,
    OpenAPIType,
    Operation,
    Parameter,
    RequestBody,
    Schema,
    SecurityRequirement,
    SecurityScheme,
)
from litestar.typing import FieldDefinition

from api.problems import PROBLEM_JSON
from metering.catalogue import EVENT_TYPES
from metering.ids import ID_PATTERN, IdKind
from metering.keys import Scope

BEARER = "apiKey"

COMPONENTS = Components(
    security_schemes={
        BEARER: SecurityScheme(
            type="http",
            scheme="bearer",
            description=(
                "A Fairmeter key, `fm_<scope>_<key id>_<secret>_<checksum>`. The roles listed "
                "on an operation are the key scopes it accepts; others get 403."
            ),
        )
    }
)


def keys(*scopes: Scope) -> list[SecurityRequirement]:
    """The operation needs a bearer key of one of ``scopes``."""
    return [{BEARER: [scope.value for scope in scopes]}]


class Problem(msgspec.Struct):
    """An RFC 9457 problem document; ``code`` is stable, other members depend on the code."""

    type: str
    title: str
    status: int
    code: str
    detail: str


_DESCRIPTIONS = {
    400: "The request is malformed (syntax, types, unknown fields)",
    401: "No API key, or one that is malformed, unknown, revoked or expired",
    403: "The key's scope does not allow this operation",
    404: "Not found, or not visible to this key",
    409: "Conflicts with what is already stored",
    413: "The body or the batch is too large",
    415: "The content type is not supported",
    422: "The request is well-formed but its values are not valid",
    429: "Too many requests for this key; see Retry-After",
    503: "A backing service is unavailable; see Retry-After",
}


def problems(*statuses: int) -> dict[int, ResponseSpec]:
    """``responses=`` for a handler: each status as an ``application/problem+json`` body."""
    return {
        status: ResponseSpec(
            data_container=Problem,
            media_type=PROBLEM_JSON,
            description=_DESCRIPTIONS[status],
            generate_examples=False,
        )
        for status in statuses
    }


# Every authenticated operation can answer these, whatever it does.
AUTHENTICATED = (400, 401, 403, 429, 503)


class StrictStructSchemaPlugin(StructSchemaPlugin):
    """Structs declared ``forbid_unknown_fields`` are documented ``additionalProperties: false``."""

    def to_openapi_schema(self, field_definition: FieldDefinition, schema_creator: Any) -> Schema:
        schema = super().to_openapi_schema(field_definition, schema_creator)
        info = msgspec.inspect.type_info(field_definition.type_)
        if isinstance(info, msgspec.inspect.StructType) and info.forbid_unknown_fields:
            schema.additional_properties = False
        return schema


def _text(max_length: int = 255) -> Schema:
    return Schema(type=OpenAPIType.STRING, min_length=1, max_length=max_length)


def _id(kind: IdKind) -> Schema:
    return Schema(
        type=OpenAPIType.STRING,
        min_length=1,
        max_length=kind.max_chars,
        pattern=ID_PATTERN,
        description=f"A {kind.noun} id (see the README's Ids section).",
    )


_EVENT = Schema(
    type=OpenAPIType.OBJECT,
    required=["specversion", "id", "source", "type", "subject", "time", "data"],
    properties={
        "specversion": Schema(type=OpenAPIType.STRING, const="1.0"),
        "id": _text(),
        "source": _text(),
        "type": Schema(type=OpenAPIType.STRING, enum=sorted(EVENT_TYPES)),
        "subject": _id(IdKind.RUN),
        "time": Schema(type=OpenAPIType.STRING, description="RFC 3339, e.g. 2025-01-31T12:00:00Z"),
        "data": Schema(
            type=OpenAPIType.OBJECT,
            required=["customer"],
            properties={"customer": _id(IdKind.CUSTOMER)},
            description="The fields of the event type (docs/events.md); unknown ones are refused.",
        ),
    },
    description="A CloudEvent 1.0 (docs/events.md). Extension attributes are flat strings.",
)


@dataclass
class IngestOperation(Operation):
    """POST /v1/events reads its body raw (the CloudEvents mode decides how): document it."""

    def __post_init__(self) -> None:
        self.request_body = RequestBody(
            required=True,
            description=(
                "One event (structured mode), a JSON array of 1-1000 events (batch mode), or "
                "binary mode: the event's data as the JSON body with its attributes in ce-* "
                "headers."
            ),
            content={
                "application/cloudevents+json": OpenAPIMediaType(schema=_EVENT),
                "application/cloudevents-batch+json": OpenAPIMediaType(
                    schema=Schema(type=OpenAPIType.ARRAY, items=_EVENT, min_items=1, max_items=1000)
                ),
            },
        )


def _otlp(description: str, json_schema: Schema) -> dict[str, OpenAPIMediaType]:
    """An OTLP message in its two encodings (binary protobuf, or protobuf's JSON mapping)."""
    return {
        "application/x-protobuf": OpenAPIMediaType(
            schema=Schema(
                type=OpenAPIType.STRING,
                format=OpenAPIFormat.BINARY,
                description=f"{description}, protobuf-encoded",
            )
        ),
        "application/json": OpenAPIMediaType(schema=json_schema),
    }


_OTLP_STATUS = _otlp(
    "A google.rpc.Status: message is '<code>: <detail>'",
    Schema(type=OpenAPIType.OBJECT, properties={"message": Schema(type=OpenAPIType.STRING)}),
)


@dataclass
class TracesOperation(Operation):
    """POST /v1/traces speaks OTLP/HTTP: protobuf or JSON in, the same encoding out, errors as
    google.rpc.Status (api/otlp_errors.py) rather than problem documents: document that."""

    def __post_init__(self) -> None:
        self.request_body = RequestBody(
            required=True,
            description=(
                "An OTLP ExportTraceServiceRequest (OTLP/HTTP; OTLP/JSON with hex trace and "
                "span ids); Content-Encoding gzip accepted. See docs/otlp.md."
            ),
            content=_otlp(
                "An ExportTraceServiceRequest",
                # Only "an object": protobuf's JSON mapping reads null as a field's default
                # and ignores unknown fields, as OTLP/JSON receivers must.
                Schema(type=OpenAPIType.OBJECT, description="OTLP/JSON: {resourceSpans: [...]}"),
            ),
        )
        partial = Schema(
            type=OpenAPIType.OBJECT,
            properties={
                "rejectedSpans": Schema(one_of=[_text(), Schema(type=OpenAPIType.INTEGER)]),
                "errorMessage": Schema(type=OpenAPIType.STRING),
            },
        )
        responses: dict[str, Any] = {
            "200": OpenAPIResponse(
                description=(
                    "Stored. partial_success (absent when every span was accepted) counts the "
                    "rejected spans and names the first reasons."
                ),
                content=_otlp(
                    "An ExportTraceServiceResponse",
                    Schema(type=OpenAPIType.OBJECT, properties={"partialSuccess": partial}),
                ),
            )
        }
        for status, description in _DESCRIPTIONS.items():
            if status in (400, 401, 403, 413, 415, 422, 429, 503):
                content = dict(_OTLP_STATUS)
                if status == 429:  # the per-request limit answers before the endpoint
                    content[PROBLEM_JSON] = OpenAPIMediaType(schema=Schema(type=OpenAPIType.OBJECT))
                responses[str(status)] = OpenAPIResponse(description=description, content=content)
        self.responses = responses


@dataclass
class StripeWebhookOperation(Operation):
    """POST /webhooks/stripe reads its body raw to check Stripe's signature: document both."""

    def __post_init__(self) -> None:
        self.parameters = [
            Parameter(
                name="Stripe-Signature",
                param_in="header",
                required=True,
                schema=Schema(type=OpenAPIType.STRING, min_length=1),
                description="Stripe's signature of the raw body (t=…,v1=…); others get 400.",
            )
        ]
        self.request_body = RequestBody(
            required=True,
            description="A Stripe event, verified against the configured webhook secret.",
            content={
                "application/json": OpenAPIMediaType(
                    schema=Schema(
                        type=OpenAPIType.OBJECT,
                        required=["id", "type"],
                        properties={
                            "id": Schema(type=OpenAPIType.STRING),
                            "type": Schema(type=OpenAPIType.STRING),
                        },
                    )
                )
            },
        )


_HTML_PAGE = OpenAPIMediaType(
    schema=Schema(type=OpenAPIType.STRING, description="An HTML page (text/html; charset=utf-8)")
)


def _with_200(operation: Operation, description: str, content: dict[str, Any]) -> None:
    """Replace the 200 Litestar infers from a ``Response[Any]`` annotation (``application/json``
    of anything) with what the handler really sends, keeping the documented problems."""
    responses = dict(operation.responses or {})
    responses["200"] = OpenAPIResponse(description=description, content=content)
    operation.responses = responses


@dataclass
class StatementOperation(Operation):
    """GET a customer's statement: JSON, CSV or HTML, chosen by the path's suffix or Accept."""

    def __post_init__(self) -> None:
        _with_200(
            self,
            "The statement: JSON by default, CSV for `.csv` or `Accept: text/csv`, an HTML "
            "page for `.html` or `Accept: text/html`.",
            {
                "application/json": OpenAPIMediaType(schema=Schema(type=OpenAPIType.OBJECT)),
                "text/csv": OpenAPIMediaType(
                    schema=Schema(type=OpenAPIType.STRING, description="One line per run")
                ),
                "text/html": _HTML_PAGE,
            },
        )


@dataclass
class StatementPageOperation(Operation):
    """GET a statement through a signed link: always the HTML page a browser shows."""

    def __post_init__(self) -> None:
        _with_200(self, "The customer's statement page.", {"text/html": _HTML_PAGE})
