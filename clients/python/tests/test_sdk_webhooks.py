"""verify(): what a receiver calls on each webhook. Signed here by the standardwebhooks
library itself, as Fairmeter signs."""

from __future__ import annotations

import base64
import json
import os
from datetime import UTC, datetime, timedelta

import pytest
from fairmeter_client.webhooks import WebhookVerificationError, verify
from standardwebhooks import Webhook

BODY = json.dumps({"type": "run.settled", "data": {"run": {"run": "run-1"}}}).encode()


def secret() -> str:
    return "whsec_" + base64.b64encode(os.urandom(32)).decode()


def signed(*secrets: str, at: datetime | None = None, body: bytes = BODY) -> dict[str, str]:
    at = at or datetime.now(UTC)
    signatures = [Webhook(s).sign("msg_1", at, body.decode()) for s in secrets]
    return {
        "Webhook-Id": "msg_1",
        "Webhook-Timestamp": str(int(at.timestamp())),
        "Webhook-Signature": " ".join(signatures),
    }


def test_a_signed_webhook_gives_its_payload_whatever_the_header_case():
    key = secret()
    assert verify(key, signed(key), BODY) == json.loads(BODY)
    assert verify(key, signed(key), BODY.decode()) == json.loads(BODY)


def test_either_signature_of_a_rotation_verifies():
    old, new = secret(), secret()
    headers = signed(new, old)
    assert verify(old, headers, BODY)["type"] == "run.settled"
    assert verify(new, headers, BODY)["type"] == "run.settled"


def test_a_receiver_may_hold_two_secrets_while_it_rolls_them():
    old, new = secret(), secret()
    assert verify([old, new], signed(new), BODY)["type"] == "run.settled"


@pytest.mark.parametrize(
    "change",
    [
        lambda h, k: (h, BODY.replace(b"run-1", b"run-2")),  # altered body
        lambda h, k: ({**h, "Webhook-Id": "msg_2"}, BODY),  # another message's signature
        lambda h, k: (signed(secret()), BODY),  # someone else's secret
        lambda h, k: (signed(k, at=datetime.now(UTC) - timedelta(minutes=6)), BODY),  # replay
        lambda h, k: ({n: v for n, v in h.items() if n != "Webhook-Signature"}, BODY),
    ],
)
def test_anything_else_is_refused(change):
    key = secret()
    headers, body = change(signed(key), key)
    with pytest.raises(WebhookVerificationError):
        verify(key, headers, body)
