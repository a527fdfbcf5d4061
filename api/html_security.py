"""The headers every HTML page of ours carries (statement pages, the console).

The pages run no script at all and load nothing from elsewhere, so the policy allows only
their own ``<style>`` blocks, by a nonce drawn for each response (never ``'unsafe-inline'``,
so injected markup can neither run nor restyle the page); inline ``style=`` attributes are
therefore not used. No framing (the console's confirm pages must not be clickjacked), forms
post only to us, and nothing is cached.
"""

from __future__ import annotations

import secrets


def new_nonce() -> str:
    """A fresh CSP nonce: 128 random bits, base64url."""
    return secrets.token_urlsafe(16)


def content_security_policy(nonce: str) -> str:
    return (
        f"default-src 'none'; style-src 'nonce-{nonce}'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    )


def html_headers(nonce: str) -> dict[str, str]:
    """The response headers of one HTML page whose ``<style>`` blocks carry ``nonce``."""
    return {
        "content-security-policy": content_security_policy(nonce),
        "x-frame-options": "DENY",
        "x-content-type-options": "nosniff",
        "referrer-policy": "same-origin",
        "cache-control": "no-store",
    }
