"""No log line ever carries an API key or its secret.

Every kind of key (valid of each scope, never issued, tampered, malformed, revoked, expired) is
sent with requests that succeed and that fail in every way, to an API process logging at DEBUG
(its JSON lines and uvicorn's, stdout and stderr) and to the in-process app under caplog,
including a request whose handler crashes so the 500 path logs a traceback. Then every
captured byte is searched for the raw keys and their secrets.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from api.logs import redact
from metering.db import raw_transaction
from metering.keys import Scope, generate_key, parse_key
from metering.keys_repo import create_key, revoke_key
from tests.helpers.database import TEST_PEPPER
from tests.helpers.events import BATCH, STRUCTURED, usage
from tests.security.harness import SERVE, client_with, serve

pytestmark = pytest.mark.timeout(120)


def issue_keys(engine: Any, make_key: Any) -> dict[str, str]:
    """name → raw key, of every kind a caller can present."""
    keys = {scope: make_key(scope=scope) for scope in ("ingest", "support", "admin")}
    keys["customer"] = make_key(scope="customer", customer="cust-1")
    revoked = make_key(scope="support")
    parsed = parse_key(revoked)
    assert parsed is not None
    with raw_transaction(engine) as conn:
        revoke_key(conn, parsed.key_id)
        _, expired = create_key(
            conn,
            tenant_id="acme",
            scope=Scope.SUPPORT,
            pepper=TEST_PEPPER,
            expires_at=datetime.now(UTC) - timedelta(seconds=1),
        )
    prefix, scope, key_id, secret, checksum = keys["ingest"].split("_")
    keys |= {
        "revoked": revoked,
        "expired": expired,
        "never issued": generate_key(Scope.ADMIN).raw,
        "tampered secret": f"{prefix}_{scope}_{key_id}_{'0' * len(secret)}_{checksum}",
        "broken checksum": keys["support"][:-1] + ("0" if keys["support"][-1] != "0" else "1"),
        "malformed": f"fm_ingest_{secret}",
    }
    return keys


def secrets_of(keys: dict[str, str]) -> set[str]:
    """The raw keys and every secret part in them (not the key ids: those are handles)."""
    found = set(keys.values())
    for raw in keys.values():
        parts = raw.split("_")
        if len(parts) == 5:
            found.add(parts[3])
    return found


def exercise(send: Any, keys: dict[str, str]) -> list[int]:
    """Requests that succeed and fail in every way, with each key in every place it could go."""
    statuses = []
    for name, key in keys.items():
        bearer = {"authorization": f"Bearer {key}"}
        requests = [
            ("GET", "/v1/runs/run-1", bearer, None),
            ("GET", f"/v1/runs/{key}", bearer, None),  # a key where an id belongs
            ("GET", f"/v1/support/runs?q={key}", bearer, None),
            ("POST", "/v1/events", {**bearer, **STRUCTURED}, json.dumps(usage(id=f"e-{name}"))),
            ("POST", "/v1/events", {**bearer, **STRUCTURED}, json.dumps(usage(input_tokens=-1))),
            ("POST", "/v1/events", {**bearer, **BATCH}, b"[" * 100_000),
            ("POST", "/v1/events", {**bearer, **STRUCTURED}, b"x" * (1024 * 1024 + 1)),
            ("POST", "/v1/support/runs/run-1/credit", bearer, json.dumps({"reason": key})),
            ("GET", "/v1/customers/cust-1/statements/current", bearer, None),
            ("GET", "/v1/runs/run-1", {"authorization": key}, None),  # no "Bearer"
            ("GET", "/v1/runs/run-1", {"authorization": f"Basic {key}"}, None),
            ("GET", "/v1/runs/run-1", {"x-api-key": key}, None),
        ]
        for method, path, headers, body in requests:
            statuses.append(send(method, path, headers, body))
    return statuses


# As deployed (``fairmeter serve``), and under uvicorn at its "trace" level with the access
# log on: uvicorn then logs every ASGI message and every path and query string, so the keys
# this test sends where an id or a search term belongs (a client's mistake) reach a log line,
# and this variant proves that such lines are written redacted.
UVICORN_TRACE = (
    *(sys.executable, "-m", "uvicorn", "api.app:create_app", "--factory"),
    *("--log-level", "trace", "--access-log"),
)


@pytest.mark.parametrize("command", [SERVE, UVICORN_TRACE], ids=["serve", "uvicorn-trace"])
def test_a_served_api_logging_at_debug_never_logs_a_key(
    settings, engine, make_key, db, tmp_path, command
):
    keys = issue_keys(engine, make_key)
    with serve(
        settings,
        tmp_path,
        workers=2,
        command=command,
        FAIRMETER_LOG_LEVEL="DEBUG",
        FAIRMETER_KEY_CACHE_TTL_S="0",
        FAIRMETER_RATE_LIMIT_ANONYMOUS_REQUESTS="100000",
    ) as api:
        with httpx.Client(base_url=api.base, timeout=30) as http:

            def send(method: str, path: str, headers: dict[str, str], body: Any) -> int:
                return http.request(method, path, headers=headers, content=body).status_code

            statuses = exercise(send, keys)
        logs = api.logs()
    assert {200, 401, 403, 404, 413, 422} <= set(statuses)
    if command is UVICORN_TRACE:  # the keys in paths were logged: redacted, and only redacted
        assert "ASGI [" in logs and '"GET /v1/runs/fm_' in logs and "_[REDACTED]" in logs
    leaked = [s for s in secrets_of(keys) if s in logs]
    assert not leaked, f"{len(leaked)} secret(s) in the logs"


def test_the_in_process_app_never_logs_a_key_even_when_it_crashes(
    settings, engine, make_key, db, caplog, monkeypatch
):
    keys = issue_keys(engine, make_key)
    import api.runs

    def crash(*_: Any, **__: Any) -> Any:
        raise RuntimeError("boom while reading a run")

    caplog.set_level(logging.DEBUG)
    with client_with(settings, log_level="DEBUG", key_cache_ttl_s=0) as client:
        root = logging.getLogger()
        root.addHandler(caplog.handler)  # the app replaced the root handlers
        try:

            def send(method: str, path: str, headers: dict[str, str], body: Any) -> int:
                reply = client.request(method, path, headers=headers, content=body)
                return int(reply.status_code)

            statuses = exercise(send, keys)
            monkeypatch.setattr(api.runs, "get_run_view", crash)
            crashed = client.get(
                "/v1/runs/run-1", headers={"authorization": f"Bearer {keys['admin']}"}
            )
        finally:
            root.removeHandler(caplog.handler)
    assert crashed.status_code == 500
    assert {200, 401, 403, 404, 413, 422} <= set(statuses)
    assert any(r.exc_info for r in caplog.records), "the crash logged no traceback"
    # The test client's own log (httpx prints the URLs it requests) is not the API's.
    records = [r for r in caplog.records if not r.name.startswith(("httpx", "httpcore"))]
    formatted = "\n".join(caplog.handler.format(r) for r in records)
    assert not [s for s in secrets_of(keys) if s in formatted]


def test_a_line_that_would_carry_a_key_is_redacted(settings, capsys):
    """Belt and braces: were a header ever logged, the formatter removes the secret."""
    from api.logs import configure_logging

    key = generate_key(Scope.ADMIN)
    configure_logging(settings.model_copy(update={"log_json": True, "log_level": "INFO"}))
    logging.getLogger("fairmeter.test").warning(
        "headers: %s", {"authorization": f"Bearer {key.raw}", "x-api-key": key.raw}
    )
    err = capsys.readouterr().err
    assert key.key_id in err and key.secret not in err and "[REDACTED]" in err
    assert key.secret not in redact(f"Authorization: {key.raw}")
