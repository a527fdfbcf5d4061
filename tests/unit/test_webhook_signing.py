"""Webhook signatures as the standardwebhooks package from PyPI verifies them, and rotation:
during the overlap both secrets verify, after it only the new one."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from freezegun import freeze_time
from standardwebhooks import Webhook, WebhookVerificationError

from metering.webhooks.secrets import (
    EndpointSeeds,
    new_seed,
    secret_from_seed,
    signing_secrets,
)
from metering.webhooks.signing import signature_headers

PEPPER = "unit-pepper-0123456789abcdef0123456789abcdef"
ROTATED_AT = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
OVERLAP = timedelta(hours=24)
BODY = json.dumps({"type": "run.settled", "data": {"run": {"run": "r1"}}}).encode()


def signed_at(seeds: EndpointSeeds, at: datetime) -> dict[str, str]:
    return signature_headers("msg_1", BODY, signing_secrets(seeds, PEPPER, at), at)


def verifies(secret: str, headers: dict[str, str]) -> bool:
    try:
        Webhook(secret).verify(BODY, headers)
    except WebhookVerificationError:
        return False
    return True


def test_a_secret_is_whsec_and_at_least_24_random_bytes_and_needs_the_pepper() -> None:
    seed = new_seed()
    secret = secret_from_seed(seed, PEPPER)
    assert secret.startswith("whsec_")
    assert len(Webhook(secret)._whsecret) >= 24
    assert secret_from_seed(seed, PEPPER) == secret  # stable: every delivery signs alike
    assert secret_from_seed(seed, PEPPER + "x") != secret  # the stored seed alone signs nothing
    assert secret_from_seed(new_seed(), PEPPER) != secret


def test_headers_follow_the_standard_and_verify_unchanged() -> None:
    seeds = EndpointSeeds(new_seed())
    with freeze_time(ROTATED_AT):
        headers = signed_at(seeds, ROTATED_AT)
        assert headers["webhook-id"] == "msg_1"
        assert headers["webhook-timestamp"] == str(int(ROTATED_AT.timestamp()))
        assert headers["webhook-signature"].startswith("v1,")
        assert " " not in headers["webhook-signature"]
        assert verifies(secret_from_seed(seeds.seed, PEPPER), headers)
        assert not verifies(secret_from_seed(new_seed(), PEPPER), headers)


@pytest.mark.parametrize(
    "after", [timedelta(0), timedelta(hours=1), OVERLAP - timedelta(seconds=1)]
)
def test_during_the_overlap_both_secrets_verify(after: timedelta) -> None:
    old, new = new_seed(), new_seed()
    seeds = EndpointSeeds(new, old, ROTATED_AT + OVERLAP)
    at = ROTATED_AT + after
    with freeze_time(at):
        headers = signed_at(seeds, at)
        assert len(headers["webhook-signature"].split(" ")) == 2
        assert verifies(secret_from_seed(old, PEPPER), headers)
        assert verifies(secret_from_seed(new, PEPPER), headers)


@pytest.mark.parametrize("after", [OVERLAP, OVERLAP + timedelta(days=30)])
def test_after_the_overlap_only_the_new_secret_verifies(after: timedelta) -> None:
    old, new = new_seed(), new_seed()
    seeds = EndpointSeeds(new, old, ROTATED_AT + OVERLAP)
    at = ROTATED_AT + after
    with freeze_time(at):
        headers = signed_at(seeds, at)
        assert len(headers["webhook-signature"].split(" ")) == 1
        assert not verifies(secret_from_seed(old, PEPPER), headers)
        assert verifies(secret_from_seed(new, PEPPER), headers)


def test_a_replayed_request_is_refused_by_the_receivers_clock() -> None:
    seeds = EndpointSeeds(new_seed())
    headers = signed_at(seeds, ROTATED_AT)
    with freeze_time(ROTATED_AT + timedelta(minutes=6)):
        assert not verifies(secret_from_seed(seeds.seed, PEPPER), headers)
