"""Forged keys with fresh key ids: limited before they are looked up; the key cache evicts."""

from __future__ import annotations

import re
import time

import httpx
import pytest
import redis

from api.auth import KeyStore
from metering.errors import MeteringError
from metering.keys import Scope, generate_key, parse_key
from tests.helpers.database import TEST_PEPPER
from tests.helpers.events import auth
from tests.security.harness import client_with, serve, unique_prefix

pytestmark = pytest.mark.timeout(180)


def key_lookups(base: str) -> dict[str, float]:
    """The served process's database reads of keys, from its /metrics."""
    text = httpx.get(f"{base}/metrics", timeout=10).text
    found = re.findall(r'^fairmeter_key_lookups_total\{result="(\w+)"\} (\S+)$', text, re.M)
    return {result: float(value) for result, value in found}


def test_forged_keys_with_fresh_ids_cost_no_lookup_once_the_address_limit_is_spent(
    settings, db, tmp_path
):
    limits = {
        "FAIRMETER_RATE_LIMIT_ANONYMOUS_REQUESTS": "20",
        "FAIRMETER_RATE_LIMIT_WINDOW_S": "60",
        "FAIRMETER_RATE_LIMIT_REDIS_PREFIX": unique_prefix(),
    }
    with serve(settings, tmp_path, **limits) as api, httpx.Client(timeout=10) as http:
        before = key_lookups(api.base).get("unknown", 0.0)
        statuses = [
            http.get(f"{api.base}/v1/runs/x", headers=auth(generate_key(Scope.INGEST).raw))
            for _ in range(200)
        ]
        lookups = key_lookups(api.base).get("unknown", 0.0) - before
    assert [r.status_code for r in statuses] == [401] * 20 + [429] * 180
    assert lookups == 20  # one per request within the limit, none after it (was 200)


def test_an_unknown_key_id_is_looked_up_once_per_cache_ttl(settings, db):
    forged = generate_key(Scope.INGEST).raw
    with client_with(settings, rate_limit_redis_prefix=unique_prefix()) as client:
        keys = client.app.state.services.keys
        before = keys.lookups
        replies = [client.get("/v1/runs/x", headers=auth(forged)) for _ in range(10)]
        assert [r.status_code for r in replies] == [401] * 10
        assert keys.lookups - before == 1  # remembered as unknown (negative cache)


def authenticates(keys: KeyStore, raw: str) -> bool:
    try:
        keys.authenticate(raw)
    except MeteringError:
        return False
    return True


def test_the_key_cache_evicts_the_least_recently_used_key_instead_of_wiping_all(engine, make_key):
    real = [make_key(scope="ingest") for _ in range(4)]
    keys = KeyStore(engine, TEST_PEPPER, ttl_s=600, max_ids=3)
    assert all(authenticates(keys, raw) for raw in real[:3])
    assert authenticates(keys, real[0])  # now the most recently used
    assert keys.lookups == 3
    assert authenticates(keys, real[3])  # a fourth: the least recently used (real[1]) goes
    assert keys.lookups == 4
    assert all(authenticates(keys, raw) for raw in (real[0], real[2], real[3]))
    assert keys.lookups == 4
    assert authenticates(keys, real[1])
    assert keys.lookups == 5


def test_a_flood_of_forged_ids_never_pushes_real_keys_out_of_the_cache(engine, make_key):
    real = [make_key(scope="ingest") for _ in range(3)]
    keys = KeyStore(engine, TEST_PEPPER, ttl_s=600, max_ids=3)
    assert all(authenticates(keys, raw) for raw in real)
    forged = [generate_key(Scope.INGEST).raw for _ in range(50)]
    assert not any(authenticates(keys, raw) for raw in forged)
    looked_up = keys.lookups
    assert all(authenticates(keys, raw) for raw in real)
    assert keys.lookups == looked_up  # the real keys are still cached
    assert not authenticates(keys, forged[-1])  # and recent forged ids are remembered
    assert keys.lookups == looked_up


FLOOD = 40  # forged keys, each with a fresh id, from one address
LOW_LIMITS = {
    "FAIRMETER_RATE_LIMIT_ANONYMOUS_REQUESTS": "5",
    "FAIRMETER_RATE_LIMIT_WINDOW_S": "60",
}


def forged_flood(http: httpx.Client, base: str) -> list[int]:
    """Tenant A's flood: ``FLOOD`` requests, each with a forged key of a fresh id."""
    return [
        http.get(f"{base}/v1/runs/x", headers=auth(generate_key(Scope.INGEST).raw)).status_code
        for _ in range(FLOOD)
    ]


def first_requests(http: httpx.Client, base: str, key: str) -> list[httpx.Response]:
    """Tenant B's first five requests to a process (no such run: its own 404)."""
    return [http.get(f"{base}/v1/runs/x", headers=auth(key)) for _ in range(5)]


def test_a_key_found_by_one_process_is_not_refused_at_another_after_a_forged_flood(
    settings, make_key, db, tmp_path
):
    """Behind a proxy every client shares one address. Tenant A's forged key ids spend that
    address's budget at a freshly started process; tenant B's key, which another process
    has found but this one never saw, must still get through there (it skips the address's
    budget), every one of its first requests."""
    b_key = make_key(tenant="tenant-b", scope="support")
    limits = {
        **LOW_LIMITS,
        "FAIRMETER_RATE_LIMIT_REDIS_PREFIX": unique_prefix(),
        "FAIRMETER_KEY_CACHE_TTL_S": "600",  # outlasts a slow start of the second process
    }
    with (
        serve(settings, tmp_path, **limits) as one,
        serve(settings, tmp_path, **limits) as fresh,
        httpx.Client(timeout=10) as http,
    ):
        # B's key found at the first process; as no process had found it yet, that lookup
        # was paid from this address's budget: one of its five.
        assert http.get(f"{one.base}/v1/runs/x", headers=auth(b_key)).status_code == 404
        assert forged_flood(http, fresh.base) == [401] * 4 + [429] * (FLOOD - 4)
        assert http.get(f"{fresh.base}/v1/runs/x").status_code == 429  # the address is spent
        b_first = first_requests(http, fresh.base, b_key)
    assert [r.status_code for r in b_first] == [404] * 5  # B's own replies, not A's 429
    assert {r.headers["RateLimit-Limit"] for r in b_first} == {"2000"}  # B's key's budget


def test_a_key_idle_for_longer_than_the_key_cache_is_not_refused_after_a_forged_flood(
    settings, make_key, db, tmp_path
):
    """Tenant B's key was last used a while ago, longer than any process trusts a lookup
    (the key cache's TTL): a process that has never seen it, its address spent by tenant
    A's flood, must still let B's first requests through (main: 5 × 429, because the id
    was remembered as found only for the key cache's TTL)."""
    b_key = make_key(tenant="tenant-b", scope="support")
    prefix = unique_prefix()
    with client_with(settings, rate_limit_redis_prefix=prefix, key_cache_ttl_s=1.0) as other:
        assert other.get("/v1/runs/x", headers=auth(b_key)).status_code == 404
    last_used = time.monotonic()
    limits = {
        **LOW_LIMITS,
        "FAIRMETER_RATE_LIMIT_REDIS_PREFIX": prefix,
        "FAIRMETER_KEY_CACHE_TTL_S": "1",
    }
    with serve(settings, tmp_path, **limits) as fresh, httpx.Client(timeout=10) as http:
        time.sleep(max(0.0, last_used + 1.5 - time.monotonic()))  # idle past the key cache
        assert forged_flood(http, fresh.base) == [401] * 5 + [429] * (FLOOD - 5)
        b_first = first_requests(http, fresh.base, b_key)
    assert [r.status_code for r in b_first] == [404] * 5
    assert {r.headers["RateLimit-Limit"] for r in b_first} == {"2000"}


def test_only_key_ids_found_in_the_database_are_shared_and_only_for_their_ttl(settings, make_key):
    """What the processes share in Redis: the real key's id, expiring after
    ``rate_limit_found_key_ttl_s``; a flood of forged ids adds nothing there."""
    real = make_key(scope="support")
    prefix = unique_prefix()
    changes = {"rate_limit_redis_prefix": prefix, "rate_limit_found_key_ttl_s": 45.0}
    with client_with(settings, **changes) as client:
        assert client.get("/v1/runs/x", headers=auth(real)).status_code == 404
        for _ in range(10):
            forged = generate_key(Scope.INGEST).raw
            assert client.get("/v1/runs/x", headers=auth(forged)).status_code == 401
    with redis.Redis.from_url(settings.redis_url) as shared:
        found = [key.decode() for key in shared.scan_iter(f"{prefix}:found:*")]
        parsed = parse_key(real)
        assert parsed is not None
        assert found == [f"{prefix}:found:{parsed.key_id}"]
        assert 0 < shared.pttl(found[0]) <= 45_000
