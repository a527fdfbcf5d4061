"""Support-console sessions, kept server-side so that they can end.

The console cookie holds a random token and nothing else: it names no key and carries no
signature, so knowing the pepper and a key id (key ids are logged by design) mints nothing.
Only the token's SHA-256 is stored, so a copy of the table opens no session either.

A session ends when it is signed out (its row is deleted), when it expires, or when its key
is revoked or expires: every request reads the session joined to its key, so the end is
immediate — within the key-cache TTL that the README promises, with room to spare.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta
from typing import Any

import psycopg

from metering.keys import Principal, Scope

SESSION_TTL = timedelta(hours=8)
# Longer cookies are not ours; refused before they are hashed or sent to the database.
MAX_TOKEN_CHARS = 100


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def open_session(conn: psycopg.Connection[Any], principal: Principal, now: datetime) -> str:
    """A new session of ``principal``'s key, valid for :data:`SESSION_TTL`; returns the token
    (for the cookie, shown nowhere else). The key's expired sessions are tidied away."""
    conn.execute(
        "DELETE FROM console_sessions WHERE key_id = %s AND expires_at <= %s",
        (principal.key_id, now),
    )
    token = secrets.token_urlsafe(32)
    conn.execute(
        "INSERT INTO console_sessions (token_sha256, tenant_id, key_id, expires_at) "
        "VALUES (%s, %s, %s, %s)",
        (_digest(token), principal.tenant_id, principal.key_id, now + SESSION_TTL),
    )
    return token


def session_principal(
    conn: psycopg.Connection[Any], token: str | None, now: datetime
) -> Principal | None:
    """Who the session behind ``token`` belongs to, while the session is live and its key is
    neither revoked nor expired; else ``None``."""
    if not token or len(token) > MAX_TOKEN_CHARS:
        return None
    row = conn.execute(
        "SELECT k.tenant_id, k.scope, k.key_id, k.customer_id "
        "FROM console_sessions s "
        "JOIN api_keys k ON k.tenant_id = s.tenant_id AND k.key_id = s.key_id "
        "WHERE s.token_sha256 = %s AND s.expires_at > %s AND k.revoked_at IS NULL "
        "AND (k.expires_at IS NULL OR k.expires_at > %s)",
        (_digest(token), now, now),
    ).fetchone()
    if row is None:
        return None
    return Principal(row[0], Scope(row[1]), row[2], row[3])


def end_session(conn: psycopg.Connection[Any], token: str) -> None:
    """Sign-out: the session stops working at once, in every API process."""
    conn.execute("DELETE FROM console_sessions WHERE token_sha256 = %s", (_digest(token),))
