"""Stream slots shared fairly between tenants on a served API process (issue #30, item 2).

A process serves a bounded number of streams; a tenant may hold only its share of them and
a key only its share of its tenant's, so one tenant, however many keys it holds, cannot take
a process's streams from another. The caps are set small in the environment, as an operator
sets them.
"""

from __future__ import annotations

import json
import re
from contextlib import ExitStack
from typing import Any

import httpx
import pytest

from tests.api.conftest import STREAM_ENV
from tests.helpers.events import auth, event
from tests.helpers.ingest import ingest
from tests.helpers.processes import wait_until
from tests.helpers.sse import StreamReader
from tests.security.harness import serve

pytestmark = pytest.mark.timeout(300)

CAPS = {
    "FAIRMETER_STREAM_MAX_PER_PROCESS": "4",
    "FAIRMETER_STREAM_MAX_PER_TENANT": "3",
    "FAIRMETER_STREAM_MAX_PER_KEY": "2",
}


@pytest.fixture
def customers(engine: Any, settings: Any, db: Any) -> None:
    """acme's customer cust-a and globex's own customer cust-g, one run each."""
    ingest(engine, settings, [event(type="run.started", run="run-a", customer="cust-a")])
    ingest(
        engine,
        settings,
        [event(type="run.started", run="run-g", customer="cust-g")],
        tenant="globex",
    )


def follow(stack: ExitStack, base: str, path: str, key: str) -> StreamReader:
    """A stream held open until ``stack`` closes; its first event has arrived."""
    reader = stack.enter_context(StreamReader(f"{base}{path}", auth(key)))
    assert reader.status == 200, f"{path}: {reader.status} {reader.body}"
    assert reader.next(timeout_s=30).event == "stream.opened"
    return reader


def refused(base: str, path: str, key: str) -> tuple[int, Any]:
    """A stream the server refuses: its status and problem document (a stream that opens
    instead is hung up on at once, not waited for)."""
    with (
        httpx.Client(timeout=30) as http,
        http.stream("GET", f"{base}{path}", headers=auth(key)) as reply,
    ):
        assert reply.status_code != 200, f"{path} opened"
        assert reply.headers["retry-after"] == "5"
        return reply.status_code, json.loads(reply.read())


def streams_open(base: str) -> float:
    text = httpx.get(f"{base}/metrics", timeout=10).text
    found = re.search(r"^fairmeter_streams_open (\S+)$", text, re.MULTILINE)
    assert found, "no fairmeter_streams_open in /metrics"
    return float(found.group(1))


@pytest.mark.usefixtures("customers")
def test_a_tenant_over_its_share_of_a_process_gets_a_429_and_another_tenant_still_streams(
    settings, make_key, tmp_path
):
    """acme fills its share with three keys; globex's first stream opens on that process
    (main: acme filled the process and globex got 503 ``too_many_streams``)."""
    acme = [make_key(tenant="acme", scope="support") for _ in range(3)]
    globex = make_key(tenant="globex", scope="support")
    acme_stream, globex_stream = "/v1/customers/cust-a/stream", "/v1/customers/cust-g/stream"
    with serve(settings, tmp_path, **STREAM_ENV, **CAPS) as api, ExitStack() as held:
        follow(held, api.base, acme_stream, acme[0])
        follow(held, api.base, acme_stream, acme[1])
        first = follow(held, api.base, acme_stream, acme[1])
        status, problem = refused(api.base, acme_stream, acme[2])  # a third key, fourth stream
        assert (status, problem["code"]) == (429, "too_many_streams_for_tenant"), problem
        assert problem["limit"] == 3 and "FAIRMETER_STREAM_MAX_PER_TENANT" in problem["detail"]

        follow(held, api.base, globex_stream, globex)  # another tenant's first stream opens

        # The process is full now, of two tenants within their shares: only then a 503.
        status, problem = refused(api.base, globex_stream, globex)
        assert (status, problem["code"]) == (503, "too_many_streams"), problem
        first.close()  # one of acme's ends (the server notices at its next heartbeat) ...
        assert wait_until(lambda: streams_open(api.base) == 3, 30)
        follow(held, api.base, acme_stream, acme[2])  # ... and acme has room again
