"""Signed, expiring statement links: how a customer opens a statement in a browser.

A browser cannot send an ``Authorization`` header from a link, so support hands the
customer a URL whose ``token`` grants read access to one customer's statement for one
period until it expires. The token is an HMAC over (tenant, customer, period, expiry) with
a key derived from the key pepper, so nothing is stored and a changed field, a forged
token or a link past its expiry is refused; rotating the pepper revokes every link.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime

from metering.errors import FieldError, forbidden, unauthenticated, validation_error
from metering.keys import Principal, Scope

_PURPOSE = b"fairmeter statement link v1"
# base64url body, a dot, and a base64url SHA-256 (43 characters): anything else was not
# made by ``sign`` and is a malformed value (422), not a failed signature (401).
TOKEN = re.compile(r"[A-Za-z0-9_-]{1,1000}\.[A-Za-z0-9_-]{43}")


@dataclass(frozen=True, slots=True)
class StatementGrant:
    tenant_id: str
    customer_id: str
    period: str
    expires_at: datetime

    def principal(self) -> Principal:
        """Read access as the customer's own key would have it, for this link only."""
        return Principal(self.tenant_id, Scope.CUSTOMER, "statement-link", self.customer_id)


def _mac(pepper: str, body: bytes) -> str:
    key = hmac.new(pepper.encode(), _PURPOSE, hashlib.sha256).digest()
    digest = hmac.new(key, body, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def sign(pepper: str, grant: StatementGrant) -> str:
    fields = [grant.tenant_id, grant.customer_id, grant.period, int(grant.expires_at.timestamp())]
    body = base64.urlsafe_b64encode(json.dumps(fields).encode()).decode().rstrip("=")
    return f"{body}.{_mac(pepper, body.encode())}"


def verify(pepper: str, token: str, *, now: datetime) -> StatementGrant:
    """The statement ``token`` grants; 422 for a malformed token, 401 for one that is not
    ours, 403 for one that has expired."""
    if not TOKEN.fullmatch(token):
        raise validation_error(
            [FieldError("$.token", "invalid_token", "a statement link's token, as sent")]
        )
    body, _, mac = token.partition(".")
    if not hmac.compare_digest(mac, _mac(pepper, body.encode())):
        raise unauthenticated("this statement link is not valid")
    try:
        tenant, customer, period, expires = json.loads(
            base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        )
    except (ValueError, TypeError):
        raise unauthenticated("this statement link is not valid") from None
    expires_at = datetime.fromtimestamp(int(expires), UTC)
    if now >= expires_at:
        raise forbidden(f"this statement link expired at {expires_at.isoformat()}; ask for another")
    return StatementGrant(tenant, customer, period, expires_at)
