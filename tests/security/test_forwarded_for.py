"""X-Forwarded-For is believed only from FAIRMETER_TRUSTED_PROXIES, so it buys no budget;
a peer outside that list that forwards anyway gets one warning in the log."""

from __future__ import annotations

import httpx
import pytest

from tests.helpers.processes import wait_until
from tests.security.harness import Served, serve, unique_prefix

pytestmark = pytest.mark.timeout(180)


def limits() -> dict[str, str]:
    return {
        "FAIRMETER_RATE_LIMIT_ANONYMOUS_REQUESTS": "3",
        "FAIRMETER_RATE_LIMIT_WINDOW_S": "60",
        "FAIRMETER_RATE_LIMIT_REDIS_PREFIX": unique_prefix(),
    }


def statuses(base: str, forwarded_for: list[str]) -> list[int]:
    with httpx.Client(base_url=base, timeout=10) as http:
        return [
            http.get("/v1/runs/x", headers={"x-forwarded-for": address}).status_code
            for address in forwarded_for
        ]


WARNING = "FAIRMETER_TRUSTED_PROXIES does not list"


def warnings(api: Served) -> int:
    return api.logs().count(WARNING)


def test_a_varying_x_forwarded_for_does_not_walk_around_the_anonymous_limit(settings, db, tmp_path):
    spoofed = [f"203.0.113.{i}" for i in range(1, 9)]
    with serve(settings, tmp_path, **limits()) as api:  # no trusted proxy: the default
        assert statuses(api.base, spoofed) == [401] * 3 + [429] * 5
        # A proxy nobody listed: its clients share its budget, and the log says so, once.
        assert wait_until(lambda: warnings(api) >= 1, timeout_s=10)
        assert warnings(api) == 1
        assert "from 127.0.0.1" in api.logs()


def test_a_trusted_proxy_s_x_forwarded_for_names_the_client_that_is_limited(settings, db, tmp_path):
    with serve(
        settings, tmp_path, FAIRMETER_TRUSTED_PROXIES="10.9.9.9, 127.0.0.0/8", **limits()
    ) as api:
        # Behind the proxy each client has its own budget...
        assert statuses(api.base, [f"198.51.100.{i}" for i in range(1, 7)]) == [401] * 6
        # ...and one client is limited whatever the proxy in front of it adds.
        one_client = ["192.0.2.7", "192.0.2.7", "192.0.2.7", "192.0.2.7"]
        assert statuses(api.base, one_client) == [401] * 3 + [429]
    assert warnings(api) == 0  # the peer is a trusted proxy: nothing to warn about


def test_a_proxy_missing_from_the_trusted_list_is_warned_about_once(settings, db, tmp_path):
    with serve(settings, tmp_path, FAIRMETER_TRUSTED_PROXIES="10.9.9.9", **limits()) as api:
        with httpx.Client(base_url=api.base, timeout=10) as http:
            assert http.get("/v1/runs/x").status_code == 401  # no header: nothing to say
        assert warnings(api) == 0
        # 127.0.0.1 is not 10.9.9.9: its header is not believed, its address is counted.
        assert statuses(api.base, ["198.51.100.1", "198.51.100.2", "198.51.100.3"]) == [
            401,
            401,
            429,
        ]
        assert wait_until(lambda: warnings(api) >= 1, timeout_s=10)
    assert warnings(api) == 1


def test_an_otlp_exporter_over_its_budget_gets_a_429_it_can_read(settings, db, tmp_path):
    """OTLP/HTTP wants every error body to be a google.rpc.Status in the request's encoding;
    the rate limiter answers before the endpoint does, so it says it that way itself."""
    with serve(settings, tmp_path, **limits()) as api, httpx.Client(base_url=api.base) as http:
        replies = [
            http.post("/v1/traces", content=b"", headers={"content-type": "application/x-protobuf"})
            for _ in range(4)
        ]
        json_reply = http.post(
            "/v1/traces", content=b"{}", headers={"content-type": "application/json"}
        )
    assert [r.status_code for r in replies] == [401] * 3 + [429]
    limited = replies[-1]
    assert limited.headers["content-type"] == "application/x-protobuf"
    assert "retry-after" in limited.headers
    # google.rpc.Status: field 2 (message), length-delimited.
    assert limited.content[:1] == b"\x12" and b"rate_limited" in limited.content
    assert json_reply.status_code == 429
    assert json_reply.json()["message"].startswith("rate_limited: ")
