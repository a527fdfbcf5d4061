"""Stripe's error JSON and status codes, as the SDK parses them.

Shape: ``{"error": {"type", "message", "code"?, "param"?, "doc_url"?}}`` — keys Stripe leaves
out when empty are left out here too. The SDK picks the exception class from the status code
(400/404 → InvalidRequestError, or IdempotencyError when ``type == "idempotency_error"``;
401 → AuthenticationError; 429 → RateLimitError; 5xx/409 → APIError).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

DOC_BASE = "https://stripe.com/docs/error-codes/"
LOCK_TIMEOUT_MESSAGE = (
    "This object cannot be accessed right now because another API request or Stripe process "
    "is currently accessing it. If you see this error intermittently, retry the request. If "
    "you see this error frequently and are making multiple concurrent requests to a single "
    "object, make your requests serially or at a lower rate."
)
RATE_LIMIT_MESSAGE = (
    "Request rate limit exceeded. Learn more about rate limits here "
    "https://stripe.com/docs/rate-limits."
)
API_ERROR_MESSAGE = (
    "An unknown error occurred while processing this request (injected by the Stripe emulator)."
)
IDEMPOTENCY_PARAMS_MESSAGE = (
    "Keys for idempotent requests can only be used with the same parameters they were first "
    "used with. Try using a key other than '{key}' if you meant to execute a different request."
)
IDEMPOTENCY_ENDPOINT_MESSAGE = (
    "Keys for idempotent requests can only be used for the same endpoint they were first used "
    "for ('{first}' vs '{second}'). Try using a key other than '{key}' if you meant to execute "
    "a different request."
)
IDEMPOTENCY_IN_USE_MESSAGE = (
    "There is currently another in-progress request using this Idempotent Key (that probably "
    "means you submitted twice, and the other request is still going through): {key}. Please "
    "try again later."
)


@dataclass(eq=False)
class StripeError(Exception):
    """An API error rendered in Stripe's shape.

    ``stored`` says whether an idempotency key keeps this response. Stripe saves "the status
    code and body of the first request made with a given idempotency key after endpoint
    execution begins" (https://docs.stripe.com/api/idempotent_requests), and "if incoming
    parameters fail validation, or the request conflicts with another that's executing
    concurrently, no idempotent result is saved" (https://docs.stripe.com/idempotency).
    Every 4xx here is such a check, made before the request changes anything, so none is
    stored: a retry with the same key runs again (after the caller fixed what was wrong, it
    succeeds). Only the 500s of execution are.
    """

    status: int
    type: str
    message: str
    code: str | None = None
    param: str | None = None
    stored: bool = False
    headers: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.status} {self.type}: {self.message}"

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {"message": self.message, "type": self.type}
        if self.code:
            error["code"] = self.code
            error["doc_url"] = DOC_BASE + self.code.replace("_", "-")
        if self.param:
            error["param"] = self.param
        return {"error": error}


def invalid_request(
    message: str, *, param: str | None = None, code: str | None = None
) -> StripeError:
    return StripeError(400, "invalid_request_error", message, code, param)


def missing_param(param: str) -> StripeError:
    return invalid_request(
        f"Missing required param: {param}.", param=param, code="parameter_missing"
    )


def unknown_param(param: str) -> StripeError:
    return invalid_request(
        f"Received unknown parameter: {param}", param=param, code="parameter_unknown"
    )


def invalid_integer(param: str, value: object) -> StripeError:
    return invalid_request(
        f"Invalid integer: {value}", param=param, code="parameter_invalid_integer"
    )


def resource_missing(
    kind: str, object_id: str, *, param: str = "id", status: int = 404
) -> StripeError:
    return StripeError(
        status,
        "invalid_request_error",
        f"No such {kind}: '{object_id}'",
        "resource_missing",
        param,
    )


def unrecognized_url(method: str, path: str) -> StripeError:
    return StripeError(
        404,
        "invalid_request_error",
        f"Unrecognized request URL ({method}: {path}). Please see https://stripe.com/docs or "
        "we can help at https://support.stripe.com/.",
    )


def authentication(api_key: str | None) -> StripeError:
    if not api_key:
        message = (
            "You did not provide an API key. You need to provide your API key in the "
            "Authorization header, using Bearer auth (e.g. 'Authorization: Bearer "
            "YOUR_SECRET_KEY')."
        )
    else:
        message = f"Invalid API Key provided: {api_key[:8]}{'*' * 4}{api_key[-4:]}"
    return StripeError(401, "invalid_request_error", message)


def rate_limited() -> StripeError:
    return StripeError(429, "invalid_request_error", RATE_LIMIT_MESSAGE, "rate_limit")


def lock_timeout() -> StripeError:
    # The SDK retries a response carrying Stripe-Should-Retry: true (its comment names lock
    # timeouts as the case), so a client with max_network_retries > 0 retries these itself.
    return StripeError(
        429,
        "invalid_request_error",
        LOCK_TIMEOUT_MESSAGE,
        "lock_timeout",
        headers={"Stripe-Should-Retry": "true"},
    )


def api_error() -> StripeError:
    return StripeError(500, "api_error", API_ERROR_MESSAGE)


def stored_api_error() -> StripeError:
    """A 500 that an idempotency key keeps and replays; the SDK is told not to retry it,
    as Stripe does ("our idempotency framework would typically replay it anyway")."""
    return StripeError(
        500, "api_error", API_ERROR_MESSAGE, stored=True, headers={"Stripe-Should-Retry": "false"}
    )


def idempotency_params(key: str) -> StripeError:
    return StripeError(400, "idempotency_error", IDEMPOTENCY_PARAMS_MESSAGE.format(key=key))


def idempotency_endpoint(key: str, first: str, second: str) -> StripeError:
    message = IDEMPOTENCY_ENDPOINT_MESSAGE.format(key=key, first=first, second=second)
    return StripeError(400, "idempotency_error", message)


def idempotency_in_use(key: str) -> StripeError:
    return StripeError(
        409,
        "invalid_request_error",
        IDEMPOTENCY_IN_USE_MESSAGE.format(key=key),
        "idempotency_key_in_use",
    )
