"""Rate limits per key, counted in Redis: headers, 429s, isolation, sharing, failing open."""

from __future__ import annotations

import asyncio
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis as AsyncRedis

from api.ratelimit import RateLimiter, lease_size
from metering.keys import Scope, generate_key
from tests.helpers.aio import run_in_fresh_loop
from tests.helpers.events import STRUCTURED, auth, usage
from tests.security.harness import client_with, serve, unique_prefix

pytestmark = pytest.mark.timeout(120)


def ingest(client: Any, key: str, **kwargs: Any) -> Any:
    body = json.dumps(usage(**kwargs))
    return client.post("/v1/events", content=body, headers=auth(key, **STRUCTURED))


def limited(settings: Any, **limits: Any) -> Any:
    """The app with small limits over a long window, counted under a prefix of its own."""
    return client_with(
        settings, rate_limit_redis_prefix=unique_prefix(), rate_limit_window_s=60.0, **limits
    )


def test_every_reply_carries_the_ratelimit_headers(settings, make_key):
    key = make_key(scope="support")
    with limited(settings, rate_limit_support_requests=5) as client:
        replies = [client.get("/v1/runs/nope", headers=auth(key)) for _ in range(3)]
    assert [r.status_code for r in replies] == [404, 404, 404]  # errors are counted too
    assert [r.headers["RateLimit-Limit"] for r in replies] == ["5", "5", "5"]
    assert [r.headers["RateLimit-Remaining"] for r in replies] == ["4", "3", "2"]
    assert all(1 <= int(r.headers["RateLimit-Reset"]) <= 60 for r in replies)


def test_over_the_limit_is_a_429_problem_with_retry_after(settings, make_key, db):
    key = make_key(scope="ingest")
    with limited(settings, rate_limit_ingest_requests=3) as client:
        ok = [ingest(client, key, id=f"e{i}") for i in range(3)]
        refused = ingest(client, key, id="e-over")
    assert [r.status_code for r in ok] == [200, 200, 200]
    assert refused.status_code == 429
    assert refused.headers["content-type"].startswith("application/problem+json")
    assert refused.json()["code"] == "rate_limited"
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    assert refused.headers["RateLimit-Remaining"] == "0"
    assert db.execute("SELECT count(*) FROM events").fetchone()[0] == 3  # the 429 stored nothing


def test_limits_are_chosen_by_scope(settings, make_key):
    ingest_key, support_key = make_key(scope="ingest"), make_key(scope="support")
    with limited(settings, rate_limit_ingest_requests=50, rate_limit_support_requests=7) as client:
        assert client.get("/v1/runs/x", headers=auth(ingest_key)).headers["RateLimit-Limit"] == "50"
        assert client.get("/v1/runs/x", headers=auth(support_key)).headers["RateLimit-Limit"] == "7"


def test_one_tenants_flood_does_not_throttle_another(settings, make_key, db):
    flooder, neighbour = make_key(tenant="flood-co"), make_key(tenant="quiet-co")
    with limited(settings, rate_limit_ingest_requests=20) as client:
        with ThreadPoolExecutor(8) as pool:
            statuses = list(
                pool.map(lambda i: ingest(client, flooder, id=f"f{i}").status_code, range(60))
            )
        assert statuses.count(200) == 20 and statuses.count(429) == 40
        assert ingest(client, neighbour, id="n1").status_code == 200
        assert ingest(client, neighbour, id="n2").headers["RateLimit-Remaining"] == "18"


def test_requests_without_a_valid_key_share_one_budget_per_address(settings, make_key):
    """A forged key (a fresh key id each time) must not buy a fresh budget. A valid key this
    process has seen keeps its own budget; one it has never seen is looked up only within
    the address's budget (tests/security/test_forged_keys.py)."""
    valid = make_key(scope="support")
    with limited(settings, rate_limit_anonymous_requests=5) as client:
        assert client.get("/v1/runs/x", headers=auth(valid)).status_code == 404  # address: 1
        statuses = [
            client.get("/v1/runs/x", headers=auth(generate_key(Scope.INGEST).raw)).status_code
            for _ in range(4)
        ]
        statuses.append(client.get("/v1/runs/x").status_code)  # no key at all: same budget
        assert statuses == [401, 401, 401, 401, 429]
        assert client.get("/v1/runs/x", headers=auth(valid)).status_code == 404


def test_probes_are_never_limited(settings):
    with limited(settings, rate_limit_anonymous_requests=1) as client:
        for _ in range(5):
            assert client.get("/healthz").status_code == 200
            assert "RateLimit-Limit" not in client.get("/healthz").headers


def test_two_api_processes_share_one_limit(settings, make_key, db, tmp_path):
    key = make_key(scope="ingest")
    limits = {
        "FAIRMETER_RATE_LIMIT_INGEST_REQUESTS": "10",
        "FAIRMETER_RATE_LIMIT_WINDOW_S": "60",
        "FAIRMETER_RATE_LIMIT_REDIS_PREFIX": unique_prefix(),
    }
    with serve(settings, tmp_path, **limits) as one, serve(settings, tmp_path, **limits) as two:
        statuses = []
        remaining = []
        for i in range(7):  # 14 requests alternating between the two processes
            for base in (one.base, two.base):
                reply = httpx.post(
                    f"{base}/v1/events",
                    content=json.dumps(usage(id=f"{base[-5:]}-{i}")),
                    headers=auth(key, **STRUCTURED),
                    timeout=10,
                )
                statuses.append(reply.status_code)
                remaining.append(int(reply.headers["RateLimit-Remaining"]))
    assert statuses == [200] * 10 + [429] * 4
    assert remaining == [9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 0, 0, 0, 0]


def test_limiter_fails_open_when_redis_is_down(settings, make_key, db, caplog):
    key = make_key(scope="ingest")
    caplog.set_level(logging.WARNING, logger="fairmeter.ratelimit")
    with client_with(
        settings, redis_url="redis://127.0.0.1:1/0", rate_limit_ingest_requests=1
    ) as client:
        logging.getLogger().addHandler(caplog.handler)  # the app replaced the root handlers
        try:
            replies = [ingest(client, key, id=f"e{i}") for i in range(5)]
        finally:
            logging.getLogger().removeHandler(caplog.handler)
    assert [r.status_code for r in replies] == [200] * 5  # over the limit, but let through
    assert all("RateLimit-Limit" not in r.headers for r in replies)
    assert db.execute("SELECT count(*) FROM events").fetchone()[0] == 5
    warnings = [r for r in caplog.records if r.name == "fairmeter.ratelimit"]
    assert warnings and "Redis unavailable" in warnings[0].getMessage()
    assert len(warnings) == 1  # one warning per outage window, not one per request


def test_a_served_api_keeps_ingesting_with_redis_down(settings, make_key, db, tmp_path):
    key = make_key(scope="ingest")
    with serve(settings, tmp_path, REDIS_URL="redis://127.0.0.1:1/0") as api:
        replies = [
            httpx.post(
                f"{api.base}/v1/events",
                content=json.dumps(usage(id=f"e{i}")),
                headers=auth(key, **STRUCTURED),
                timeout=10,
            )
            for i in range(3)
        ]
        assert [r.status_code for r in replies] == [200, 200, 200]
        assert httpx.get(f"{api.base}/readyz", timeout=10).status_code == 503
    assert "Redis unavailable" in api.logs()


# --- leases: large limits cost Redis one call per 1 % of the limit -----------------------


def limiters(settings: Any, count: int, **limits: Any) -> tuple[list[RateLimiter], str]:
    """``count`` limiters (as in that many API processes) on one real Redis and prefix."""
    prefix = unique_prefix()
    tuned = settings.model_copy(
        update={"rate_limit_redis_prefix": prefix, "rate_limit_window_s": 60.0, **limits}
    )
    made = [
        RateLimiter(AsyncRedis.from_url(settings.redis_url), keys=None, settings=tuned)  # type: ignore[arg-type]
        for _ in range(count)
    ]
    return made, f"{prefix}:key:k1"


def test_a_large_limit_is_counted_in_leases_of_one_percent(settings, redis_service_url):
    async def run() -> tuple[list[int], list[int]]:
        (limiter,), counter = limiters(settings, 1)
        redis = AsyncRedis.from_url(redis_service_url)
        remaining, counted = [], []
        for _ in range(25):
            verdict = await limiter.hit("key:k1", 1000)
            assert verdict is not None and verdict.allowed
            remaining.append(verdict.remaining)
            counted.append(int(await redis.get(counter)))
        await redis.aclose()
        return remaining, counted

    remaining, counted = run_in_fresh_loop(run)
    assert lease_size(1000) == 10
    assert remaining == list(range(999, 974, -1))  # exact, as if counted one by one
    assert counted == [10] * 10 + [20] * 10 + [30] * 5  # one INCRBY per ten requests


def test_processes_sharing_a_leased_limit_never_admit_more_than_it(settings):
    async def run() -> tuple[int, int, list[int]]:
        group, _ = limiters(settings, 3)
        allowed = refused = 0
        remaining = []
        for i in range(400):  # round robin over three processes, limit 300 (leases of 3)
            verdict = await group[i % 3].hit("key:k1", 300)
            assert verdict is not None
            allowed += verdict.allowed
            refused += not verdict.allowed
            if verdict.allowed:
                remaining.append(verdict.remaining)
        return allowed, refused, remaining

    allowed, refused, remaining = run_in_fresh_loop(run)
    assert 300 - 3 * lease_size(300) <= allowed <= 300  # at most a lease per process unspent
    assert refused == 400 - allowed
    assert min(remaining) >= 0 and len(set(remaining)) == len(remaining)  # no count twice


def test_concurrent_requests_share_one_lease_instead_of_each_taking_one(
    settings, redis_service_url
):
    async def run() -> tuple[list[bool], list[int], int]:
        (limiter,), counter = limiters(settings, 1)
        verdicts = await asyncio.gather(*(limiter.hit("key:k1", 1000) for _ in range(100)))
        redis = AsyncRedis.from_url(redis_service_url)
        counted = int(await redis.get(counter))
        await redis.aclose()
        return [v.allowed for v in verdicts if v], [v.remaining for v in verdicts if v], counted

    allowed, remaining, counted = run_in_fresh_loop(run)
    assert allowed == [True] * 100
    assert sorted(remaining) == list(range(900, 1000))
    assert counted == 100  # ten leases of ten, none wasted


def test_a_spent_window_refuses_without_asking_redis_again(settings, redis_service_url):
    async def run() -> tuple[list[bool], int]:
        (limiter,), counter = limiters(settings, 1)
        verdicts = [await limiter.hit("key:k1", 5) for _ in range(12)]
        redis = AsyncRedis.from_url(redis_service_url)
        counted = int(await redis.get(counter))
        await redis.aclose()
        return [bool(v and v.allowed) for v in verdicts], counted

    allowed, counted = run_in_fresh_loop(run)
    assert allowed == [True] * 5 + [False] * 7
    assert counted == 6  # the first refusal asked Redis; the rest were refused locally
