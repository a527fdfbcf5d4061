"""Console cookies and CSRF tokens. The sessions themselves live server-side
(``metering.console_sessions``): the cookie holds only a random token, so sign-out and key
revocation end a session, and the pepper alone mints none.

CSRF tokens are HMACs of the session token, so a form rendered for one session is refused
in any other; the sign-in form, which has no session yet, uses a double-submit cookie.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

from metering.console_sessions import SESSION_TTL
from metering.keys import Scope

SESSION_COOKIE = "fm_console"
LOGIN_COOKIE = "fm_console_login"
COOKIE_PATH = "/console"
CONSOLE_SCOPES = (Scope.SUPPORT, Scope.ADMIN)
__all__ = ["CONSOLE_SCOPES", "COOKIE_PATH", "LOGIN_COOKIE", "SESSION_COOKIE", "SESSION_TTL"]


def _signing_key(pepper: str) -> bytes:
    # Derived, so a CSRF token can never be confused with a stored key HMAC.
    return hmac.new(pepper.encode(), b"console-session", hashlib.sha256).digest()


def _sign(pepper: str, message: str) -> str:
    digest = hmac.new(_signing_key(pepper), message.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


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
