"""Verifying Fairmeter's webhooks in a receiver: a thin wrapper over ``standardwebhooks``.

Fairmeter signs every webhook per the Standard Webhooks specification (``webhook-id``,
``webhook-timestamp``, ``webhook-signature``), so any of its libraries verifies them; this
one only takes the header mappings web frameworks hand you and returns the payload::

    from fairmeter_client.webhooks import WebhookVerificationError, verify

    try:
        event = verify(secret, request.headers, request.body)
    except WebhookVerificationError:
        ...  # answer 400: not from Fairmeter, altered, or replayed more than 5 minutes later
    event["type"], event["data"]["run"]["status"]

Messages arrive at least once: deduplicate on ``headers["webhook-id"]``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from standardwebhooks import Webhook, WebhookVerificationError

__all__ = ["WebhookVerificationError", "verify"]


def verify(
    secret: str | Iterable[str], headers: Mapping[str, str], body: bytes | str
) -> dict[str, Any]:
    """The webhook's payload if ``body`` with ``headers`` was signed with ``secret`` (a
    ``whsec_…`` string, or several while you roll your own secrets) within the last five
    minutes; :class:`WebhookVerificationError` otherwise. ``body`` is the raw request body,
    exactly as received."""
    plain = {str(name).lower(): str(value) for name, value in headers.items()}
    secrets = [secret] if isinstance(secret, str) else list(secret)
    for candidate in secrets:
        try:
            payload = Webhook(candidate).verify(body, plain)
        except WebhookVerificationError:
            continue
        if not isinstance(payload, dict):
            raise WebhookVerificationError("the payload is not a JSON object")
        return payload
    raise WebhookVerificationError("no signature matches the secret")
