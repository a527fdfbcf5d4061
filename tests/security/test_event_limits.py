"""Events per window per key: batching does not multiply a key's budget."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.helpers.events import BATCH, auth, usage
from tests.security.harness import client_with, unique_prefix

pytestmark = pytest.mark.timeout(180)


def batch(client: Any, key: str, name: str, count: int) -> Any:
    body = json.dumps([usage(id=f"{name}-{i}", run=f"run-{name}") for i in range(count)])
    return client.post("/v1/events", content=body, headers=auth(key, **BATCH))


def stored(db: Any) -> int:
    return int(db.execute("SELECT count(*) FROM events").fetchone()[0])


def test_thousand_event_batches_spend_the_events_limit_not_just_the_requests_limit(
    settings, make_key, db
):
    """The issue's case: 1,000-event batches through a 50-request limit stored 50,000 events."""
    key = make_key(scope="ingest")
    with client_with(
        settings,
        rate_limit_redis_prefix=unique_prefix(),
        rate_limit_window_s=60.0,
        rate_limit_ingest_requests=50,
        rate_limit_ingest_events=5000,
    ) as client:
        replies = [batch(client, key, f"b{i}", 1000) for i in range(8)]
    assert [r.status_code for r in replies] == [200] * 5 + [429] * 3
    refused = replies[5]
    assert refused.headers["content-type"].startswith("application/problem+json")
    assert refused.json()["code"] == "rate_limited"
    assert "5000 events" in refused.json()["detail"]
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    assert stored(db) == 5000  # a refused batch stores nothing


def test_a_batch_that_does_not_fit_is_refused_whole(settings, make_key, db):
    key = make_key(scope="ingest")
    with client_with(
        settings,
        rate_limit_redis_prefix=unique_prefix(),
        rate_limit_window_s=60.0,
        rate_limit_ingest_events=50,
    ) as client:
        assert batch(client, key, "a", 20).status_code == 200
        assert batch(client, key, "b", 20).status_code == 200
        assert batch(client, key, "c", 20).status_code == 429  # 60 > 50: none of the 20
    assert stored(db) == 40


def test_one_keys_events_do_not_spend_another_keys_budget(settings, make_key, db):
    flooder, neighbour = make_key(tenant="flood-co"), make_key(tenant="quiet-co")
    with client_with(
        settings,
        rate_limit_redis_prefix=unique_prefix(),
        rate_limit_window_s=60.0,
        rate_limit_ingest_events=100,
    ) as client:
        assert batch(client, flooder, "f1", 100).status_code == 200
        assert batch(client, flooder, "f2", 1).status_code == 429
        assert batch(client, neighbour, "n1", 100).status_code == 200
    assert stored(db) == 200


def test_more_keys_do_not_multiply_a_tenant_s_events_and_its_neighbour_keeps_its_own(
    settings, make_key, db
):
    """A tenant's keys share one events budget (issue #30: a tenant issuing a key per end
    customer multiplied the per-key budget by its number of keys); the OTLP path spends
    the same budget, and another tenant's is untouched."""
    from tests.api.test_otlp_gzip_members import run_export

    first, second = make_key(tenant="many-keys-co"), make_key(tenant="many-keys-co")
    neighbour = make_key(tenant="next-door-co")
    with client_with(
        settings,
        rate_limit_redis_prefix=unique_prefix(),
        rate_limit_window_s=60.0,
        rate_limit_tenant_events=100,
    ) as client:
        assert batch(client, first, "k1", 60).status_code == 200
        export = client.post(
            "/v1/traces",
            content=run_export("budget-otlp"),
            headers=auth(second, **{"content-type": "application/x-protobuf"}),
        )
        assert export.status_code == 200  # two events (the model call, the run's end): 62
        refused = batch(client, second, "k2", 40)  # 40 would fit its own key, not the tenant
        assert refused.status_code == 429, refused.text
        assert refused.json()["code"] == "rate_limited"
        assert "more than 100 events in this window for this tenant" in refused.json()["detail"]
        assert 1 <= int(refused.headers["Retry-After"]) <= 60
        assert batch(client, neighbour, "n1", 100).status_code == 200
    assert stored(db) == 60 + 2 + 100  # a refused batch stores nothing
