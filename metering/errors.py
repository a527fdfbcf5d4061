"""One error hierarchy. Each error knows its stable ``code`` and HTTP status.

The API renders these as ``application/problem+json``; the CLI prints them. Expected
outcomes (bad input, conflicts, missing things) are never 500s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class FieldError:
    """One bad field: a JSON path (``$[2].data.input_tokens``), a code and a message."""

    path: str
    code: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"path": self.path, "code": self.code, "message": self.message}


@dataclass
class MeteringError(Exception):
    """Base class. ``extra`` carries machine-readable details for the problem document."""

    detail: str
    code: str = "error"
    status: int = 400
    title: str = "Bad request"
    errors: list[FieldError] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.code}: {self.detail}"


def validation_error(errors: list[FieldError], detail: str | None = None) -> MeteringError:
    """422 naming every bad field. The code is the first error's, so clients can switch on it."""
    first = errors[0]
    return MeteringError(
        detail=detail or f"{len(errors)} invalid field(s); first: {first.path}: {first.message}",
        code=first.code,
        status=422,
        title="Invalid events",
        errors=errors,
    )


def unauthenticated(detail: str = "a valid API key is required") -> MeteringError:
    return MeteringError(detail, code="unauthenticated", status=401, title="Unauthenticated")


def forbidden(detail: str) -> MeteringError:
    return MeteringError(detail, code="forbidden", status=403, title="Forbidden")


def not_found(detail: str, code: str = "not_found") -> MeteringError:
    return MeteringError(detail, code=code, status=404, title="Not found")


def conflict(detail: str, code: str, **extra: Any) -> MeteringError:
    return MeteringError(detail, code=code, status=409, title="Conflict", extra=extra)


def payload_too_large(detail: str) -> MeteringError:
    return MeteringError(detail, code="payload_too_large", status=413, title="Payload too large")


def unsupported_media_type(detail: str) -> MeteringError:
    return MeteringError(
        detail, code="unsupported_media_type", status=415, title="Unsupported media type"
    )


def bad_request(detail: str, code: str = "bad_request") -> MeteringError:
    return MeteringError(detail, code=code, status=400, title="Bad request")


def unstorable_value() -> MeteringError:
    """400 for a value the database refused to store (a data exception), which validation
    should have refused first with its path. The value is not repeated: it may not print."""
    return MeteringError(
        "a value in the request cannot be stored (e.g. a NUL character or a number out of range)",
        code="invalid_value",
        status=400,
        title="Bad request",
    )


def service_unavailable(detail: str, retry_after_s: int = 5) -> MeteringError:
    return MeteringError(
        detail,
        code="service_unavailable",
        status=503,
        title="Service unavailable",
        extra={"retry_after_s": retry_after_s},
    )


def credit_exceeds_gross(
    detail: str, *, creditable_micros: int, credit_micros: int
) -> MeteringError:
    """409: the credit is more than the run still bills, so it would take the run's credited
    amount above its gross; nothing was credited (``creditable_micros`` is what is left)."""
    return conflict(
        detail,
        code="credit_exceeds_gross",
        creditable_micros=creditable_micros,
        credit_micros=credit_micros,
    )


def credit_above_limit(
    detail: str, *, limit: str, limit_micros: int, granted_micros: int, credit_micros: int
) -> MeteringError:
    """403: the credit would take support credits above ``limit`` ("per_run" or
    "per_customer_per_day"); an admin key is needed. ``granted_micros`` counts the credits
    already granted under that limit."""
    return MeteringError(
        detail,
        code="credit_above_limit",
        status=403,
        title="Forbidden",
        extra={
            "limit": limit,
            "limit_micros": limit_micros,
            "granted_micros": granted_micros,
            "credit_micros": credit_micros,
        },
    )


def rate_limited(detail: str, retry_after_s: int) -> MeteringError:
    """429: over a rate limit; ``Retry-After`` says when the window ends."""
    return MeteringError(
        detail,
        code="rate_limited",
        status=429,
        title="Too many requests",
        extra={"retry_after_s": retry_after_s},
    )
