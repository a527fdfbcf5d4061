"""Every id that ingest accepts is reachable (issue #13 §4).

The grammar lives in ``metering/ids.py`` (and the README's Ids section). Ingest refuses an id
outside it with 422 ``invalid_id`` naming the field; every id inside it reaches every by-id
route — run read, settle, release, credit, timeline, statement JSON/CSV/HTML, console page
and console action — and so do ids with ``/`` and other characters that a deployment older
than the grammar may have stored, percent-encoded, through the real server.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metering.errors import MeteringError
from metering.ids import ID_PATTERN, IdKind, is_valid_id
from tests.helpers.events import BATCH, STRUCTURED, auth, usage
from tests.security.reach import (
    held_run_events,
    reach_every_route,
    seed_legacy_run,
    sign_in_to_console,
)

pytestmark = pytest.mark.timeout(300)


def ids(kind: IdKind) -> st.SearchStrategy[str]:
    """Ids from the grammar, short ones most of the time and now and then the longest."""
    body = st.from_regex(ID_PATTERN, fullmatch=True).filter(lambda s: len(s) <= kind.max_chars)
    longest = st.from_regex(ID_PATTERN, fullmatch=True).map(
        lambda s: (s * kind.max_chars)[: kind.max_chars]
    )
    return st.one_of(body, longest)


OUTSIDE = [
    ("org-7/run-1", "a slash"),
    ("org-7%2Frun-1", "an encoded slash"),
    ("a b", "a space"),
    ("=cmd|' /C calc'!A0", "a formula"),
    ("-1", "a leading minus"),
    ("..", "a dot segment"),
    (".hidden", "a leading dot"),
    ("a?b", "a query"),
    ("a#b", "a fragment"),
    ('a"b', "a quote"),
    ("a\r\nb", "CR LF"),
    ("a\nb", "a trailing-newline trick"),
    ("a\n", "a trailing newline"),
    ("müller", "non-ASCII"),
    ("a\x00b", "NUL"),
]


@pytest.mark.parametrize(("bad", "why"), OUTSIDE, ids=[why for _, why in OUTSIDE])
def test_ingest_refuses_a_run_or_customer_id_outside_the_grammar_naming_the_field(
    client, make_key, db, bad, why
):
    key = make_key()
    cases = [
        ("$.subject", STRUCTURED, usage(run=bad, customer="cust-1")),
        ("$.data.customer", STRUCTURED, usage(run="run-1", customer=bad)),
        ("$[0].subject", BATCH, [usage(run=bad, customer="cust-1")]),
        ("$[0].data.customer", BATCH, [usage(run="run-1", customer=bad)]),
    ]
    for path, mode, body in cases:
        reply = client.post("/v1/events", content=json.dumps(body), headers=auth(key, **mode))
        assert reply.status_code == 422, f"{why} at {path}: {reply.status_code} {reply.text}"
        problem = reply.json()
        assert problem["code"] == "invalid_id"
        assert [e["path"] for e in problem["errors"]] == [path]
    assert db.execute("SELECT count(*) FROM events").fetchone()[0] == 0


def test_ingest_refuses_ids_one_character_too_long(client, make_key, db):
    key = make_key()
    for path, event in (
        ("$.subject", usage(run="r" * (IdKind.RUN.max_chars + 1))),
        ("$.data.customer", usage(customer="c" * (IdKind.CUSTOMER.max_chars + 1))),
    ):
        reply = client.post(
            "/v1/events", content=json.dumps(event), headers=auth(key, **STRUCTURED)
        )
        assert reply.status_code == 422 and reply.json()["errors"][0]["path"] == path


def test_binary_mode_subject_header_follows_the_grammar(client, make_key, db):
    event = usage(run="org-7/run-1")
    headers = {f"ce-{k}": str(v) for k, v in event.items() if k != "data"}
    reply = client.post(
        "/v1/events",
        content=json.dumps(event["data"]),
        headers=auth(make_key(), **headers, **{"content-type": "application/json"}),
    )
    assert reply.status_code == 422, reply.text
    [error] = reply.json()["errors"]
    assert (error["path"], error["code"]) == ("$.subject", "invalid_id")


def test_keys_refuse_tenant_and_customer_ids_outside_the_grammar(make_key):
    for tenant, customer in (("acme/eu", None), ("acme", "org/7"), ("acme", "a\r\nb")):
        with pytest.raises(MeteringError) as refused:
            make_key(tenant=tenant, scope="customer" if customer else "ingest", customer=customer)
        assert refused.value.code == "invalid_id"


# Text a client might send instead: mostly the characters that mean something in a URL, a
# header or a spreadsheet, now and then anything at all.
HOSTILE = st.one_of(
    st.text(st.sampled_from("/?#%. \"';,=+-@\t\r\n\x00aZ9ü"), max_size=8),
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=8),
)


def sent(kind: IdKind) -> st.SearchStrategy[str]:
    """Three draws in four from the grammar, so most examples get past ingest."""
    return st.one_of(ids(kind), ids(kind), ids(kind), HOSTILE)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(run=sent(IdKind.RUN), customer=sent(IdKind.CUSTOMER))
def test_every_id_ingest_accepts_reaches_every_by_id_route(client, make_key, run, customer):
    """Ingest accepts exactly the ids of the grammar; each one it accepts, every by-id route
    reaches (read, settle, release, credit, timeline, statement JSON/CSV/HTML, console)."""
    tenant = f"t{uuid.uuid4().hex[:12]}"  # a fresh tenant: examples may repeat ids
    ingest_key = make_key(tenant=tenant, scope="ingest")
    reply = client.post(
        "/v1/events",
        content=json.dumps(held_run_events(run, customer)),
        headers=auth(ingest_key, **BATCH),
    )
    grammatical = is_valid_id(run, IdKind.RUN) and is_valid_id(customer, IdKind.CUSTOMER)
    if not grammatical:
        assert reply.status_code == 422, reply.text
        errors = reply.json()["errors"]
        assert {e["path"].split(".", 1)[1] for e in errors} <= {"subject", "data.customer"}
        assert "invalid_id" in {e["code"] for e in errors}
        return
    assert reply.status_code == 200, reply.text
    support = make_key(tenant=tenant, scope="support")
    client.cookies.clear()
    sign_in_to_console(client, "", support)
    reach_every_route(client, "", run=run, customer=customer, support=support)


LEGACY = [
    ("org-7/run-1", "org/7"),
    ("=cmd|' /C calc'!A0", 'a"b; filename=evil.exe'),
    ("a b?c#d", "c\r\nd"),
    ("50%off", "müller gmbh"),
    ("%2F", "-1+1"),
]


@pytest.mark.parametrize(("run", "customer"), LEGACY, ids=[r for r, _ in LEGACY])
def test_ids_stored_before_the_grammar_stay_reachable_through_the_served_api(
    live_server, engine, settings, make_key, run, customer
):
    assert not is_valid_id(run, IdKind.RUN) or not is_valid_id(customer, IdKind.CUSTOMER)
    seed_legacy_run(engine, settings, tenant="legacy", run=run, customer=customer)
    support = make_key(tenant="legacy", scope="support")
    with httpx.Client(timeout=30) as client:
        sign_in_to_console(client, live_server, support)
        reach_every_route(client, live_server, run=run, customer=customer, support=support)


def test_an_id_with_an_encoded_slash_is_not_confused_with_a_longer_path(
    live_server, engine, settings, make_key
):
    """``org-7%2Fsettle`` is a run id, not the settle route of run ``org-7``."""
    seed_legacy_run(engine, settings, tenant="legacy", run="org-7/settle", customer="c1")
    support = make_key(tenant="legacy", scope="support")
    reply: Any = httpx.get(f"{live_server}/v1/runs/org-7%2Fsettle", headers=auth(support))
    assert reply.status_code == 200 and reply.json()["run"] == "org-7/settle", reply.text
    plain = httpx.get(f"{live_server}/v1/runs/org-7", headers=auth(support))
    assert plain.status_code == 404
