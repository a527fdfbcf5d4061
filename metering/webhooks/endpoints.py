"""A tenant's webhook endpoints: create, read, change, delete, rotate the secret.

Admins only: an endpoint decides where a tenant's run data goes. Another tenant's endpoint
is a 404 (ids cannot be probed). Bad input is a 422 naming each bad field; nothing is
written then.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg

from metering.config import Settings
from metering.errors import FieldError, MeteringError, forbidden, not_found, validation_error
from metering.ids import IdKind, is_valid_id
from metering.keys import Principal, Scope
from metering.notifications.catalogue import EVENT_TYPES
from metering.webhooks.secrets import new_seed, secret_from_seed
from metering.webhooks.targets import UrlRefused, check_endpoint_url

MAX_ENDPOINTS_PER_TENANT = 50
MAX_DESCRIPTION_CHARS = 500


@dataclass(frozen=True, slots=True)
class EndpointView:
    id: str
    url: str
    event_types: list[str]
    description: str
    enabled: bool
    disabled_reason: str | None
    disabled_at: datetime | None
    created_at: datetime
    updated_at: datetime
    # Until when the secret replaced by the last rotation still signs beside the new one.
    previous_secret_expires_at: datetime | None


@dataclass(frozen=True, slots=True)
class EndpointSpec:
    url: str
    event_types: Sequence[str] = ()
    description: str = ""
    enabled: bool = True


@dataclass(frozen=True, slots=True)
class EndpointChange:
    """``None``: leave as it is."""

    url: str | None = None
    event_types: Sequence[str] | None = None
    description: str | None = None
    enabled: bool | None = None


_COLUMNS = """id, url, event_types, description, enabled, disabled_reason, disabled_at,
    created_at, updated_at,
    CASE WHEN previous_seed_expires_at > now() THEN previous_seed_expires_at END"""


def require_admin(principal: Principal) -> None:
    """Endpoints decide where a tenant's data goes: admin keys only."""
    if principal.scope is not Scope.ADMIN:
        raise forbidden(f"this key has scope {principal.scope.value}; webhooks need admin")


def _view(row: Sequence[Any]) -> EndpointView:
    return EndpointView(
        id=row[0],
        url=row[1],
        event_types=list(row[2]),
        description=row[3],
        enabled=row[4],
        disabled_reason=row[5],
        disabled_at=row[6],
        created_at=row[7],
        updated_at=row[8],
        previous_secret_expires_at=row[9],
    )


def endpoint_not_found(endpoint_id: str) -> MeteringError:
    return not_found(f"no webhook endpoint {endpoint_id}", code="endpoint_not_found")


def _checked_url(url: str, settings: Settings, errors: list[FieldError]) -> str:
    try:
        check_endpoint_url(url, allow_private=settings.webhooks_allow_private)
    except UrlRefused as refused:
        errors.append(FieldError("$.url", refused.code, refused.message))
    return url


def _checked_types(types: Sequence[str], errors: list[FieldError]) -> list[str]:
    for i, name in enumerate(types):
        if name not in EVENT_TYPES:
            known = ", ".join(sorted(EVENT_TYPES))
            errors.append(
                FieldError(
                    f"$.event_types[{i}]",
                    "unknown_event_type",
                    f"{name!r} is not an event type; known: {known}",
                )
            )
    return list(dict.fromkeys(types))  # once each, in the order given


def _checked_description(text: str, errors: list[FieldError]) -> str:
    if len(text) > MAX_DESCRIPTION_CHARS:
        errors.append(
            FieldError(
                "$.description", "invalid_value", f"at most {MAX_DESCRIPTION_CHARS} characters"
            )
        )
    elif any(_unprintable(c) for c in text):
        errors.append(
            FieldError("$.description", "invalid_value", "no control characters or surrogates")
        )
    return text


def _unprintable(c: str) -> bool:
    code = ord(c)
    return (code < 0x20 and c not in "\n\t") or code == 0x7F or 0xD800 <= code <= 0xDFFF


def _raise_if(errors: list[FieldError]) -> None:
    if errors:
        raise validation_error(errors)


def create_endpoint(
    conn: psycopg.Connection[Any], principal: Principal, spec: EndpointSpec, settings: Settings
) -> tuple[EndpointView, str]:
    """Store a new endpoint; its view and its secret, which is shown this once."""
    require_admin(principal)
    errors: list[FieldError] = []
    url = _checked_url(spec.url, settings, errors)
    types = _checked_types(spec.event_types, errors)
    description = _checked_description(spec.description, errors)
    _raise_if(errors)
    if (
        conn.execute("SELECT 1 FROM tenants WHERE id = %s", (principal.tenant_id,)).fetchone()
        is None
    ):
        raise not_found(f"no tenant {principal.tenant_id}", code="tenant_not_found")
    # Serialise one tenant's creations, so the limit holds under concurrent requests.
    conn.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended('webhook_endpoints:' || %s, 0))",
        (principal.tenant_id,),
    )
    (count,) = conn.execute(
        "SELECT count(*) FROM webhook_endpoints WHERE tenant_id = %s", (principal.tenant_id,)
    ).fetchone() or (0,)
    if count >= MAX_ENDPOINTS_PER_TENANT:
        raise MeteringError(
            f"a tenant has at most {MAX_ENDPOINTS_PER_TENANT} webhook endpoints",
            code="too_many_endpoints",
            status=409,
            title="Conflict",
        )
    seed = new_seed()
    row = conn.execute(
        f"""
        INSERT INTO webhook_endpoints (id, tenant_id, url, event_types, description, enabled,
                                       secret_seed)
        VALUES (%s, %s, %s, %s, %s, %s, %s)
        RETURNING {_COLUMNS}
        """,
        (
            "ep_" + secrets.token_hex(12),
            principal.tenant_id,
            url,
            types,
            description,
            spec.enabled,
            seed,
        ),
    ).fetchone()
    assert row is not None
    return _view(row), secret_from_seed(seed, settings.key_pepper)


def list_endpoints(conn: psycopg.Connection[Any], principal: Principal) -> list[EndpointView]:
    require_admin(principal)
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM webhook_endpoints WHERE tenant_id = %s ORDER BY created_at, id",
        (principal.tenant_id,),
    ).fetchall()
    return [_view(r) for r in rows]


def get_endpoint(
    conn: psycopg.Connection[Any], principal: Principal, endpoint_id: str, *, lock: bool = False
) -> EndpointView:
    """The endpoint if it is the principal's tenant's; 404 otherwise."""
    require_admin(principal)
    if not is_valid_id(endpoint_id, IdKind.TENANT):
        raise endpoint_not_found(endpoint_id)
    row = conn.execute(
        f"SELECT {_COLUMNS} FROM webhook_endpoints WHERE tenant_id = %s AND id = %s"
        + (" FOR UPDATE" if lock else ""),
        (principal.tenant_id, endpoint_id),
    ).fetchone()
    if row is None:
        raise endpoint_not_found(endpoint_id)
    return _view(row)


def update_endpoint(
    conn: psycopg.Connection[Any],
    principal: Principal,
    endpoint_id: str,
    change: EndpointChange,
    settings: Settings,
) -> EndpointView:
    """Change what ``change`` names. Enabling clears the reason it was disabled (and its
    failure streak); disabling by hand records who did it."""
    current = get_endpoint(conn, principal, endpoint_id, lock=True)
    errors: list[FieldError] = []
    url = current.url if change.url is None else _checked_url(change.url, settings, errors)
    types = (
        current.event_types
        if change.event_types is None
        else _checked_types(change.event_types, errors)
    )
    description = (
        current.description
        if change.description is None
        else _checked_description(change.description, errors)
    )
    _raise_if(errors)
    enabled = current.enabled if change.enabled is None else change.enabled
    reason = current.disabled_reason
    if enabled and not current.enabled:
        reason = None
    elif not enabled and current.enabled:
        reason = f"disabled by key {principal.key_id}"
    row = conn.execute(
        f"""
        UPDATE webhook_endpoints
        SET url = %s, event_types = %s, description = %s, enabled = %s,
            disabled_reason = %s,
            disabled_at = CASE WHEN %s THEN NULL ELSE coalesce(disabled_at, now()) END,
            failing_since = CASE WHEN %s AND NOT enabled THEN NULL ELSE failing_since END,
            updated_at = now()
        WHERE tenant_id = %s AND id = %s
        RETURNING {_COLUMNS}
        """,
        (
            url,
            types,
            description,
            enabled,
            reason,
            enabled,
            enabled,
            principal.tenant_id,
            endpoint_id,
        ),
    ).fetchone()
    assert row is not None
    return _view(row)


def delete_endpoint(conn: psycopg.Connection[Any], principal: Principal, endpoint_id: str) -> None:
    """Delete the endpoint with its messages and their delivery log."""
    get_endpoint(conn, principal, endpoint_id, lock=True)
    conn.execute(
        "DELETE FROM webhook_endpoints WHERE tenant_id = %s AND id = %s",
        (principal.tenant_id, endpoint_id),
    )


def rotate_secret(
    conn: psycopg.Connection[Any],
    principal: Principal,
    endpoint_id: str,
    settings: Settings,
    now: datetime,
) -> tuple[EndpointView, str]:
    """A new secret, shown this once; the one it replaces keeps signing beside it for
    ``webhooks_secret_overlap_s`` (a second rotation within that drops the oldest)."""
    get_endpoint(conn, principal, endpoint_id, lock=True)
    seed = new_seed()
    row = conn.execute(
        f"""
        UPDATE webhook_endpoints
        SET previous_secret_seed = secret_seed, previous_seed_expires_at = %s,
            secret_seed = %s, updated_at = now()
        WHERE tenant_id = %s AND id = %s
        RETURNING {_COLUMNS}
        """,
        (
            now + timedelta(seconds=settings.webhooks_secret_overlap_s),
            seed,
            principal.tenant_id,
            endpoint_id,
        ),
    ).fetchone()
    assert row is not None
    return _view(row), secret_from_seed(seed, settings.key_pepper)
