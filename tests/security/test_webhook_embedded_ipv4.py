"""An endpoint URL naming an IPv6 address that carries a loopback, link-local or private IPv4
address (6to4, Teredo, NAT64) is refused as the IPv4 address itself is: a 422 on ``$.url``,
nothing written (issue #30: ``https://[2002:7f00:1::1]/`` was accepted)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.helpers.events import auth

ENDPOINTS = "/v1/webhooks/endpoints"

CARRYING = {
    "2002:7f00:1::1": "127.0.0.1",  # 6to4
    "2002:a9fe:a9fe::1": "169.254.169.254",  # 6to4: the cloud metadata service
    "2001:0:4136:e378:8000:63bf:80ff:fffe": "127.0.0.1",  # Teredo client (obfuscated)
    "2001:0:a9fe:a9fe::1": "169.254.169.254",  # Teredo server
    "64:ff9b::a00:5": "10.0.0.5",  # NAT64, well-known prefix
    "64:ff9b:1::7f00:1": "127.0.0.1",  # NAT64, local-use prefix
}


def create(client: Any, key: str, url: str) -> Any:
    headers = auth(key, **{"content-type": "application/json"})
    return client.post(ENDPOINTS, content=json.dumps({"url": url}), headers=headers)


@pytest.mark.parametrize(("literal", "ipv4"), CARRYING.items())
def test_an_ipv6_literal_carrying_a_non_public_ipv4_address_is_a_422_on_the_url(
    client, make_key, db, literal, ipv4
):
    reply = create(client, make_key(scope="admin"), f"https://[{literal}]/hooks")

    assert reply.status_code == 422, reply.text
    problem = reply.json()
    assert problem["code"] == "url_target_forbidden"
    assert [error["path"] for error in problem["errors"]] == ["$.url"]
    assert ipv4 in reply.text
    assert db.execute("SELECT count(*) FROM webhook_endpoints").fetchone()[0] == 0


def test_an_ipv6_literal_carrying_a_public_ipv4_address_through_nat64_is_accepted(
    client, make_key, db
):
    reply = create(client, make_key(scope="admin"), "https://[64:ff9b::5db8:d70e]/hooks")

    assert reply.status_code == 201, reply.text
