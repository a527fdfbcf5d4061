"""The Standard Webhooks headers of one delivery attempt (standardwebhooks.com).

``webhook-id`` is the message's id, the same on every retry, so receivers deduplicate on
it; ``webhook-timestamp`` is the attempt's time (receivers refuse old ones, which is what
stops a captured request from being replayed later); ``webhook-signature`` holds one
``v1,<base64 HMAC-SHA256>`` per secret in force, space-separated. Signed by the
``standardwebhooks`` package itself, so what we sign is exactly what its verifiers check.
"""

from __future__ import annotations

from datetime import UTC, datetime

from standardwebhooks import Webhook


def signature_headers(msg_id: str, body: bytes, secrets: list[str], at: datetime) -> dict[str, str]:
    """The headers for sending ``body`` (UTF-8 JSON) as message ``msg_id`` at ``at``."""
    at = at.astimezone(UTC)
    text = body.decode()
    signatures = [Webhook(secret).sign(msg_id, at, text) for secret in secrets]
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": " ".join(signatures),
        "content-type": "application/json",
    }
