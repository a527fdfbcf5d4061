"""The demo receiver of `make up`: signed deliveries over real loopback HTTP, verified with the
SDK, each message handed on once however often it is delivered, forgeries refused."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import msgspec
import pytest

from devtools.webhook_receiver import DemoReceiver, describe
from metering.policy.status import COMPLETED, COMPLETED_CREDITED, FAILED_RESTORED, UNDER_REVIEW
from metering.webhooks.payload import message_body
from metering.webhooks.secrets import new_seed, secret_from_seed
from metering.webhooks.signing import signature_headers

SECRET = secret_from_seed(new_seed(), "a pepper long enough for the test of the receiver")


def run(status: str, **micros: int) -> dict[str, Any]:
    amounts = {"billed_micros": 0, "credited_micros": 0, "held_micros": 0, **micros}
    return {"run": "demo-00019", "customer": "demo-customer", "status": status, **amounts}


@pytest.fixture
def received() -> Iterator[tuple[DemoReceiver, list[dict[str, Any]]]]:
    events: list[dict[str, Any]] = []
    receiver = DemoReceiver(events.append).start()
    receiver.secret = SECRET
    try:
        yield receiver, events
    finally:
        receiver.close()


def send(receiver: DemoReceiver, msg_id: str, body: bytes, secret: str = SECRET) -> int:
    headers = signature_headers(msg_id, body, [secret], datetime.now(UTC))
    return httpx.post(receiver.url, content=body, headers=headers, timeout=30).status_code


def test_a_delivery_is_verified_and_handed_on_once_however_often_it_arrives(received):
    receiver, events = received
    body = message_body("run.settled", datetime.now(UTC), {}, run(FAILED_RESTORED))
    assert send(receiver, "msg_1", body) == 204
    assert send(receiver, "msg_1", body) == 204  # a retry after a lost reply
    assert [event["data"]["run"]["status"] for event in events] == [FAILED_RESTORED]
    forged = secret_from_seed(new_seed(), "another pepper, another tenant's secret, no")
    assert send(receiver, "msg_2", body, secret=forged) == 400
    assert len(events) == 1


def test_describe_says_the_runs_words_and_the_amount_never_rounded_to_zero():
    def line(status: str, **micros: int) -> str | None:
        return describe({"type": "run.settled", "data": {"run": run(status, **micros)}})

    assert line(FAILED_RESTORED, credited_micros=100_000) == (
        "webhook: run demo-00019 · Run failed — usage restored · 0.10 USD restored"
    )
    assert line(COMPLETED_CREDITED, billed_micros=5, credited_micros=4_200) == (
        f"webhook: run demo-00019 · {COMPLETED_CREDITED} · 0.0042 USD credited"
    )
    assert line(UNDER_REVIEW, held_micros=2_500_000) == (
        f"webhook: run demo-00019 · {UNDER_REVIEW} · 2.50 USD held"
    )
    assert line(COMPLETED, billed_micros=30) == (
        f"webhook: run demo-00019 · {COMPLETED} · 0.00003 USD billed"
    )
    changed = {"type": "run.status_changed", "data": {"run": run(COMPLETED)}}
    assert describe(msgspec.json.decode(msgspec.json.encode(changed))) is None
