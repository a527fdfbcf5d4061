"""Endpoint signing secrets: made once, shown once, never stored.

The table keeps a random seed per endpoint; the secret is HMAC-SHA256(key pepper, seed),
rendered ``whsec_<base64>`` as the Standard Webhooks libraries expect. Whoever reads the
database alone (a backup, a replica, a leaked dump) therefore cannot sign a webhook our
tenants would accept; signing needs the pepper too, as verifying an API key does. The price:
the pepper is kept for good (it already must be), and a tenant cannot bring a secret of its
own. A rotation keeps the previous seed signing beside the new one for an overlap, so a
receiver mid-deploy verifies with either.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime

SECRET_PREFIX = "whsec_"  # noqa: S105  (the format's prefix, not a secret)
SEED_BYTES = 32
_LABEL = b"fairmeter webhook signing secret v1\x00"


def new_seed() -> str:
    """A fresh random seed (URL-safe base64 of 32 bytes)."""
    return secrets.token_urlsafe(SEED_BYTES)


def secret_from_seed(seed: str, pepper: str) -> str:
    """The ``whsec_`` secret an endpoint's receiver verifies with (32 bytes of key)."""
    key = hmac.new(pepper.encode(), _LABEL + seed.encode(), hashlib.sha256).digest()
    return SECRET_PREFIX + base64.b64encode(key).decode()


@dataclass(frozen=True, slots=True)
class EndpointSeeds:
    seed: str
    previous_seed: str | None = None
    previous_expires_at: datetime | None = None


def signing_secrets(seeds: EndpointSeeds, pepper: str, at: datetime) -> list[str]:
    """The secrets that sign a delivery made at ``at``: the current one, and during the
    overlap after a rotation the previous one too (receivers accept either signature)."""
    found = [secret_from_seed(seeds.seed, pepper)]
    if (
        seeds.previous_seed is not None
        and seeds.previous_expires_at is not None
        and at < seeds.previous_expires_at
    ):
        found.append(secret_from_seed(seeds.previous_seed, pepper))
    return found
