"""Health, readiness and metrics."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from litestar.testing import TestClient

from api.metrics import forget_dead_processes
from tests.helpers.events import STRUCTURED, auth, usage


def test_healthz_answers(client):
    assert client.get("/healthz").json() == {"status": "ok", "checks": {}}


def test_readyz_is_ready_with_database_and_redis(client):
    reply = client.get("/readyz")
    assert reply.status_code == 200
    assert reply.json()["checks"] == {"database": "ok", "redis": "ok"}


def test_readyz_is_503_when_redis_is_unreachable(settings, db):
    from api.app import create_app

    broken = settings.model_copy(update={"redis_url": "redis://127.0.0.1:1/0"})
    with TestClient(app=create_app(broken)) as client:
        reply = client.get("/readyz")
    assert reply.status_code == 503
    assert reply.json()["checks"]["redis"].startswith("down")


def test_readyz_is_503_when_the_database_is_unreachable(settings, db):
    from api.app import create_app

    broken = settings.model_copy(
        update={"database_url": "postgresql://postgres@127.0.0.1:1/nothing"}
    )
    with TestClient(app=create_app(broken)) as client:
        reply = client.get("/readyz")
    assert reply.status_code == 503
    assert reply.json()["checks"]["database"].startswith("down")


def test_ingest_is_503_with_retry_after_when_the_database_is_unreachable(settings, db, make_key):
    from api.app import create_app

    key = make_key()
    broken = settings.model_copy(
        update={"database_url": "postgresql://postgres@127.0.0.1:1/nothing"}
    )
    with TestClient(app=create_app(broken)) as client:
        reply = client.post(
            "/v1/events", content=json.dumps(usage()), headers=auth(key, **STRUCTURED)
        )
    assert reply.status_code == 503
    assert reply.headers["retry-after"] == "5"
    assert reply.json()["code"] == "database_unavailable"


def _sample(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_metrics_count_accepted_duplicate_and_rejected_events(client, make_key):
    key = make_key()
    before = client.get("/metrics").text
    body = json.dumps(usage(id="m1"))
    client.post("/v1/events", content=body, headers=auth(key, **STRUCTURED))
    client.post("/v1/events", content=body, headers=auth(key, **STRUCTURED))
    client.post(
        "/v1/events", content=json.dumps(usage(model="nope")), headers=auth(key, **STRUCTURED)
    )
    after = client.get("/metrics").text
    name = "fairmeter_events_total"
    assert _sample(after, name, result="accepted") - _sample(before, name, result="accepted") == 1
    assert _sample(after, name, result="duplicate") - _sample(before, name, result="duplicate") == 1
    delta = _sample(after, name, result="rejected", code="unknown_model") - _sample(
        before, name, result="rejected", code="unknown_model"
    )
    assert delta == 1
    assert "fairmeter_request_seconds_bucket" in after


def test_the_served_app_freezes_its_start_up_heap_once_started(settings, db):
    """`fairmeter serve` runs this factory; its start-up objects leave the GC's scans."""
    import gc

    from api.app import create_app, create_served_app

    gc.unfreeze()
    try:
        with TestClient(app=create_app(settings)) as plain:
            assert plain.get("/healthz").status_code == 200
            assert gc.get_freeze_count() == 0  # tests build many apps: they freeze nothing
        served = create_served_app(settings)
        assert gc.get_freeze_count() == 0  # not before start-up: uvicorn forks workers first
        with TestClient(app=served) as client:
            assert client.get("/healthz").status_code == 200
            assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


def test_metrics_name_their_charset_once(client):
    content_type = client.get("/metrics").headers["content-type"]
    assert content_type.count("charset") == 1, content_type
    assert content_type.startswith("text/plain; version=")


def test_a_scrape_forgets_only_the_live_gauges_of_processes_that_no_longer_run(tmp_path):
    """Counters and histograms of a dead worker stay (they are totals); its live gauges go,
    and a running process's stay."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    names = [
        f"gauge_livesum_{gone.pid}.db",
        f"gauge_livemax_{gone.pid}.db",
        f"counter_{gone.pid}.db",
        f"gauge_livesum_{os.getpid()}.db",
        f"gauge_all_{gone.pid}.db",
    ]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    assert forget_dead_processes(tmp_path) == [gone.pid]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[2:])
