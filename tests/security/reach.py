"""Reaching one run and its customer through every by-id route, as their owners would.

Used by the id-grammar tests: the property over ids ingest accepts, and the ids a deployment
older than the grammar may have stored (seeded below the validation, as it then stored them).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

from markupsafe import escape

from metering.config import Settings
from metering.db import raw_transaction
from metering.ingest.service import IngestRequest, prepare_request, store_prepared
from metering.ingest.validation import content_hash
from metering.keys_repo import ensure_tenant
from metering.prices import CatalogCache, load_catalog
from tests.helpers.events import auth
from tests.helpers.scenarios import scenario

Get = Callable[..., Any]


def segment(value: str) -> str:
    """An id as one URL path segment: every reserved character percent-encoded."""
    return quote(value, safe="")


def held_run_events(run: str, customer: str) -> list[dict[str, Any]]:
    """A run the policy holds for review (a client-side claim), ended minutes ago."""
    return scenario("client-claim", run, customer, datetime.now(UTC) - timedelta(minutes=10))


def seed_legacy_run(
    engine: Any, settings: Settings, *, tenant: str, run: str, customer: str
) -> None:
    """Store a held run under ids the grammar refuses, the way ingest stored any string before
    it: the events are validated under stand-in ids, then stored under the real ones."""

    def stand_in(event: dict[str, Any]) -> dict[str, Any]:
        return {**event, "subject": "stand-in", "data": {**event["data"], "customer": "stand-in"}}

    def restore(valid: Any) -> Any:
        data = {**valid.data, "customer": customer}
        attributes = {**valid.attributes, "subject": run}
        return dataclasses.replace(
            valid,
            subject=run,
            customer=customer,
            data=data,
            attributes=attributes,
            body_hash=content_hash(attributes, data),
        )

    def load() -> Any:
        with raw_transaction(engine) as conn:
            return load_catalog(conn)

    events = [stand_in(e) for e in held_run_events(run, customer)]
    request = IngestRequest(tenant, events, single=False, received_at=datetime.now(UTC))
    prepared = prepare_request(request, settings, CatalogCache(load))
    legacy = dataclasses.replace(prepared, events=[restore(v) for v in prepared.events])
    with raw_transaction(engine) as conn:
        ensure_tenant(conn, tenant)
        store_prepared(conn, legacy)


def sign_in_to_console(client: Any, base: str, key: str) -> None:
    """The console's own sign-in form: its nonce cookie and field, then the key."""
    form = client.get(f"{base}/console/login")
    assert form.status_code == 200, form.text
    nonce = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert nonce, form.text
    reply = client.post(
        f"{base}/console/login",
        data={"csrf": nonce.group(1), "key": key, "next": "/console"},
        follow_redirects=False,
    )
    assert reply.status_code == 303, reply.text


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, html[:500]
    return found.group(1)


def reach_every_route(client: Any, base: str, *, run: str, customer: str, support: str) -> None:
    """Settle the held run, preview and do its release, credit it, read it, its timeline, its
    customer's statement as JSON, CSV and HTML, and its console page: each must answer 2xx
    about this very run. ``client`` is signed in to the console."""
    r, c = segment(run), segment(customer)
    headers = auth(support)

    def call(method: str, path: str, body: Any = None, **kw: Any) -> Any:
        content = None if body is None else json.dumps(body)
        hdrs = {**headers, "content-type": "application/json"} if body is not None else headers
        reply = client.request(method, f"{base}{path}", content=content, headers=hdrs, **kw)
        assert reply.status_code < 300, f"{method} {path}: {reply.status_code} {reply.text[:300]}"
        return reply

    settled = call("POST", f"/v1/support/runs/{r}/settle").json()
    assert (settled["run"], settled["customer"]) == (run, customer)
    assert settled["outcome"] == "held_for_review"
    page = client.get(f"{base}/console/runs/{r}")
    assert page.status_code == 200, page.text[:300]
    preview = client.post(
        f"{base}/console/runs/{r}/release",
        data={"csrf": csrf_of(page.text), "reason": "checked"},
    )
    assert preview.status_code == 200 and 'id="confirm"' in preview.text, preview.text[:300]
    released = call("POST", f"/v1/support/runs/{r}/release", {"reason": "checked"}).json()
    assert released["outcome"] != "held_for_review"
    credited = call("POST", f"/v1/support/runs/{r}/credit", {"full": True, "reason": "goodwill"})
    assert credited.json()["run"] == run
    assert call("GET", f"/v1/runs/{r}").json()["run"] == run
    assert call("GET", f"/v1/support/runs/{r}").json()["run"]["run"] == run
    period = settled["decisions"][-1]["period"]
    statement = f"/v1/customers/{c}/statements/{period}"
    body = call("GET", statement).json()
    assert body["customer"] == customer and run in [line["run"] for line in body["lines"]]
    as_csv = call("GET", f"{statement}.csv")
    rows = list(csv.DictReader(io.StringIO(as_csv.text)))
    assert run in {row["run"].removeprefix("'") for row in rows}
    as_html = call("GET", f"{statement}.html")
    assert str(escape(run)) in as_html.text and str(escape(customer)) in as_html.text
    console = client.get(f"{base}/console/runs/{r}")
    assert console.status_code == 200 and str(escape(run)) in console.text, console.text[:300]
