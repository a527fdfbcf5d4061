"""Console sessions: a signed, expiring token in an HttpOnly cookie, and CSRF tokens bound to it.

The cookie never holds the API key. It holds ``payload.signature`` where the payload names
the key id, tenant, scope and expiry, and the signature is HMAC-SHA256 under a key derived
from the key pepper. Every request verifies the signature and the expiry, and then asks the
key store whether the key still exists and is neither revoked nor expired, so revoking a
support key ends its console sessions too (within the key cache's TTL).

CSRF tokens are HMACs of the session token, so a form rendered for one session is refused
in any other; the sign-in form, which has no session yet, uses a double-submit cookie.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from metering.keys import Principal, Scope

SESSION_COOKIE = "fm_console"
LOGIN_COOKIE = "fm_console_login"
COOKIE_PATH = "/console"
SESSION_TTL = timedelta(hours=8)
CONSOLE_SCOPES = (Scope.SUPPORT, Scope.ADMIN)


@dataclass(frozen=True, slots=True)
class SessionClaims:
    key_id: str
    tenant_id: str
    scope: Scope
    expires_at: datetime


def _signing_key(pepper: str) -> bytes:
    # Derived, so a console cookie can never be confused with a stored key HMAC.
    return hmac.new(pepper.encode(), b"console-session", hashlib.sha256).digest()


def _sign(pepper: str, message: str) -> str:
    digest = hmac.new(_signing_key(pepper), message.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def issue(principal: Principal, pepper: str, now: datetime) -> str:
    """A session token for ``principal``, valid for :data:`SESSION_TTL`."""
    payload = {
        "k": principal.key_id,
        "t": principal.tenant_id,
        "s": principal.scope.value,
        "exp": int((now + SESSION_TTL).timestamp()),
        "n": secrets.token_urlsafe(9),  # two sign-ins never share a token (or CSRF token)
    }
    body = base64.urlsafe_b64encode(json.dumps(payload, separators=(",", ":")).encode())
    encoded = body.rstrip(b"=").decode()
    return f"{encoded}.{_sign(pepper, encoded)}"


def verify(token: str | None, pepper: str, now: datetime) -> SessionClaims | None:
    """The token's claims when the signature is ours and it has not expired; else ``None``."""
    if not token or token.count(".") != 1:
        return None
    encoded, signature = token.split(".")
    if not hmac.compare_digest(signature, _sign(pepper, encoded)):
        return None
    try:
        payload = json.loads(base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)))
        claims = SessionClaims(
            key_id=str(payload["k"]),
            tenant_id=str(payload["t"]),
            scope=Scope(payload["s"]),
            expires_at=datetime.fromtimestamp(int(payload["exp"]), tz=now.tzinfo),
        )
    except (ValueError, KeyError, TypeError):
        return None
    if claims.expires_at <= now or claims.scope not in CONSOLE_SCOPES:
        return None
    return claims


def csrf_token(session_token: str, pepper: str) -> str:
    """The CSRF token every form of this session carries."""
    return _sign(pepper, f"csrf:{session_token}")


def csrf_matches(session_token: str, pepper: str, presented: str | None) -> bool:
    return bool(presented) and hmac.compare_digest(
        csrf_token(session_token, pepper), str(presented)
    )


def login_nonce() -> str:
    """The double-submit value for the sign-in form (set as a cookie and a hidden field)."""
    return secrets.token_urlsafe(18)


def same_nonce(cookie: str | None, presented: str | None) -> bool:
    return bool(cookie) and bool(presented) and hmac.compare_digest(str(cookie), str(presented))
