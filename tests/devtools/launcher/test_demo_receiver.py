"""Each `make up` subscribes its demo receiver; it no longer leaves the last run's behind
(issue #31 item 4: an enabled endpoint per start, each on a port that was gone, its
deliveries failing and retried for a day, piling up in the console).

The API is served for real; the receivers are the demo's own, on loopback."""

from __future__ import annotations

from contextlib import ExitStack

import httpx

from devtools.launcher import DEMO_RECEIVER, DemoKey, start_demo_receiver
from tests.security.harness import serve


def test_a_second_start_replaces_the_demo_endpoint_and_keeps_the_tenants_own(
    settings, tmp_path, make_key, db
):
    admin = make_key(tenant="demo", scope="admin")
    auth = {"authorization": f"Bearer {admin}"}
    keys = [DemoKey("admin", admin, None)]
    with serve(settings, tmp_path, FAIRMETER_WEBHOOKS_ALLOW_PRIVATE="true") as api:
        own = httpx.post(
            f"{api.base}/v1/webhooks/endpoints",
            json={"url": "https://hooks.example.com/fairmeter", "description": "ours"},
            headers=auth,
            timeout=30,
        )
        assert own.status_code == 201, own.text
        with ExitStack() as first_run:
            first = start_demo_receiver(api.base, keys, first_run)
        with ExitStack() as second_run:
            second = start_demo_receiver(api.base, keys, second_run)
            listed = httpx.get(f"{api.base}/v1/webhooks/endpoints", headers=auth, timeout=30)

    described = sorted(e["description"] for e in listed.json())
    assert described == sorted([DEMO_RECEIVER, "ours"]), listed.json()  # one demo endpoint
    endpoints = {e["description"]: e for e in listed.json()}
    demo = endpoints[DEMO_RECEIVER]
    assert second.startswith(demo["url"]) and demo["enabled"]
    assert not first.startswith(demo["url"])  # the first run's port is gone with it
    assert endpoints["ours"]["id"] == own.json()["id"]
