"""API keys: format, hashing and verification (pure; storage is in ``keys_repo``).

A key reads ``fm_<scope>_<key id>_<secret>_<checksum>``: the prefix makes a leaked key easy to
recognise (and to scan for), the key id is the lookup handle, the checksum lets us reject a
mistyped key without touching the database. Only HMAC-SHA256(pepper, key) is stored.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import zlib
from dataclasses import dataclass
from enum import StrEnum


class Scope(StrEnum):
    INGEST = "ingest"
    CUSTOMER = "customer"
    SUPPORT = "support"
    ADMIN = "admin"


KEY_PREFIX = "fm"


@dataclass(frozen=True, slots=True)
class ParsedKey:
    scope: Scope
    key_id: str
    secret: str
    raw: str


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the tenant, the scope, and for customer keys the one customer."""

    tenant_id: str
    scope: Scope
    key_id: str
    customer_id: str | None = None


def _checksum(body: str) -> str:
    return f"{zlib.crc32(body.encode()):08x}"[:6]


def generate_key(scope: Scope) -> ParsedKey:
    """A fresh key; the caller shows ``raw`` once and stores only :func:`key_hmac`."""
    key_id = secrets.token_hex(8)
    secret = secrets.token_hex(24)
    body = f"{KEY_PREFIX}_{scope.value}_{key_id}_{secret}"
    raw = f"{body}_{_checksum(body)}"
    return ParsedKey(scope=scope, key_id=key_id, secret=secret, raw=raw)


def parse_key(raw: str) -> ParsedKey | None:
    """The key's parts, or ``None`` when it is not a well-formed Fairmeter key."""
    parts = raw.split("_")
    if len(parts) != 5 or parts[0] != KEY_PREFIX:
        return None
    prefix, scope, key_id, secret, checksum = parts
    try:
        parsed_scope = Scope(scope)
    except ValueError:
        return None
    body = f"{prefix}_{scope}_{key_id}_{secret}"
    if not hmac.compare_digest(checksum, _checksum(body)):
        return None
    return ParsedKey(scope=parsed_scope, key_id=key_id, secret=secret, raw=raw)


def key_hmac(raw: str, pepper: str) -> str:
    return hmac.new(pepper.encode(), raw.encode(), hashlib.sha256).hexdigest()


def hmac_matches(raw: str, pepper: str, stored_hmac: str) -> bool:
    """Constant-time comparison of a presented key with the stored HMAC."""
    return hmac.compare_digest(key_hmac(raw, pepper), stored_hmac)
