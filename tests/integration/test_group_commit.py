"""Group commit: requests stored together keep each request's own guarantees (real DB)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from api.ingest_group import GroupCommitter, store_group
from metering.db import raw_transaction
from metering.errors import MeteringError
from metering.ingest.service import IngestRequest, PreparedRequest, prepare_request
from metering.ingest.store import IngestResult
from metering.keys_repo import ensure_tenant
from metering.prices import CatalogCache, load_catalog
from tests.helpers.aio import run_in_fresh_loop
from tests.helpers.events import event, usage


@pytest.fixture
def prepare(engine: Any, settings: Any, db: Any) -> Any:
    catalogs = CatalogCache(lambda: _catalog(engine))
    with raw_transaction(engine) as conn:
        ensure_tenant(conn, "acme")
        ensure_tenant(conn, "other")

    def factory(*events: dict[str, Any], tenant: str = "acme") -> PreparedRequest:
        request = IngestRequest(tenant, list(events), single=False, received_at=datetime.now(UTC))
        return prepare_request(request, settings, catalogs)

    return factory


def _catalog(engine: Any) -> Any:
    with raw_transaction(engine) as conn:
        return load_catalog(conn)


def results(outcomes: list[Any]) -> list[Any]:
    return [
        [e.result for e in o.events] if isinstance(o, IngestResult) else o.code for o in outcomes
    ]


def test_requests_stored_together_report_their_own_events(engine, prepare, db):
    shared = usage(id="shared", run="run-a")
    group = [
        prepare(shared, event(type="run.completed", id="done", run="run-a")),
        prepare(usage(id="b1", run="run-b", customer="cust-2")),
        prepare(shared),  # the same event again, in a later request of the group
        prepare(usage(id="o1", run="run-a"), tenant="other"),
    ]
    outcomes = store_group(engine, group)
    assert results(outcomes) == [
        ["accepted", "accepted"],
        ["accepted"],
        ["duplicate"],
        ["accepted"],
    ]
    assert [(o.accepted, o.duplicates) for o in outcomes] == [(2, 0), (1, 0), (0, 1), (1, 0)]
    stored = db.execute(
        "SELECT r.tenant_id, r.subject, r.event_count, r.gross_micros, "
        "(SELECT sum(amount_micros) FROM ledger_entries l WHERE l.run_id = r.id) "
        "FROM runs r ORDER BY 1, 2"
    ).fetchall()
    # 1,000 input + 500 output tokens of agent-large-1: 10,500 micros per usage event.
    assert stored == [
        ("acme", "run-a", 2, 10_500, 10_500),
        ("acme", "run-b", 1, 10_500, 10_500),
        ("other", "run-a", 1, 10_500, 10_500),
    ]


def test_a_conflicting_request_fails_alone_and_the_rest_of_its_group_is_stored(engine, prepare, db):
    assert results(store_group(engine, [prepare(usage(id="u1", input_tokens=10))])) == [
        ["accepted"]
    ]
    group = [
        prepare(usage(id="before", run="run-2")),
        prepare(usage(id="u1", input_tokens=99)),  # same id, other content: 409
        prepare(usage(id="after", run="run-3")),
    ]
    outcomes = store_group(engine, group)
    assert results(outcomes) == [["accepted"], "event_conflict", ["accepted"]]
    assert isinstance(outcomes[1], MeteringError) and outcomes[1].status == 409
    ids = db.execute("SELECT event_id FROM events ORDER BY event_id").fetchall()
    assert ids == [("after",), ("before",), ("u1",)]
    assert db.execute(
        "SELECT data->>'input_tokens' FROM events WHERE event_id = 'u1'"
    ).fetchone() == ("10",)


def test_two_requests_claiming_one_run_for_different_customers_keep_the_first(engine, prepare, db):
    group = [
        prepare(usage(id="mine", run="run-x", customer="cust-1")),
        prepare(usage(id="theirs", run="run-x", customer="cust-2")),
    ]
    assert results(store_group(engine, group)) == [["accepted"], "customer_mismatch"]
    assert db.execute("SELECT customer_id, event_count FROM runs").fetchall() == [("cust-1", 1)]


def test_concurrent_requests_share_transactions_and_each_gets_its_result(engine, prepare, db):
    events = [usage(id=f"e{i}", run=f"run-{i % 7}", step=i + 1) for i in range(60)]
    requests = [prepare(e) for e in events] + [prepare(events[5])]  # and a retry of e5

    async def send_all() -> tuple[list[IngestResult], GroupCommitter]:
        committer = GroupCommitter(engine, max_events=1000, max_flushes=1)
        replies = await asyncio.gather(*(committer.store(r) for r in requests))
        return list(replies), committer

    replies, committer = run_in_fresh_loop(send_all)
    assert [r.events[0].result for r in replies] == ["accepted"] * 60 + ["duplicate"]
    assert committer.flushed_requests == 61
    assert committer.flushes < 61  # the first went alone; the rest queued behind it
    assert db.execute("SELECT count(*), sum(gross_micros) FROM usage_lines").fetchone() == (
        60,
        60 * 10_500,
    )


def test_a_refused_request_raises_its_error_from_the_committer(engine, prepare, db):
    store_group(engine, [prepare(usage(id="u1", input_tokens=10))])

    async def send() -> list[Any]:
        committer = GroupCommitter(engine, max_events=1000, max_flushes=1)
        clash = prepare(usage(id="u1", input_tokens=11))
        fine = prepare(usage(id="u2"))
        return await asyncio.gather(
            committer.store(clash), committer.store(fine), return_exceptions=True
        )

    clash, fine = run_in_fresh_loop(send)
    assert isinstance(clash, MeteringError) and clash.code == "event_conflict"
    assert isinstance(fine, IngestResult) and fine.accepted == 1


# --- the property: a group stores exactly what its requests stored one by one would -----

EVENT_IDS = ["a", "b", "c", "d"]
T0 = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=30)


def _pool_event(event_id: str, variant: int, run: str, customer: str) -> dict[str, Any]:
    """Same (id, variant, run, customer) → same content; another variant → a conflict."""
    return usage(
        id=event_id,
        run=run,
        customer=customer,
        input_tokens=100 + variant,
        time=T0 + timedelta(seconds=EVENT_IDS.index(event_id)),
    )


pool_event = st.builds(
    _pool_event,
    st.sampled_from(EVENT_IDS),
    st.integers(0, 1),
    st.sampled_from(["run-1", "run-2"]),
    st.sampled_from(["cust-1", "cust-2"]),
)
request_events = st.lists(pool_event, min_size=1, max_size=3)


def _snapshot(db: Any) -> tuple[Any, ...]:
    events = db.execute(
        "SELECT e.tenant_id, e.event_id, e.body_hash, r.subject FROM events e "
        "JOIN runs r ON r.id = e.run_id ORDER BY 1, 2"
    ).fetchall()
    runs = db.execute(
        "SELECT tenant_id, subject, customer_id, event_count, evidence_version, gross_micros, "
        "first_event_at, last_event_at, terminal_at FROM runs ORDER BY 1, 2"
    ).fetchall()
    holds = db.execute(
        "SELECT run_id, count(*), sum(amount_micros) FROM ledger_entries GROUP BY 1 ORDER BY 1"
    ).fetchall()
    return events, runs, len(holds), sum(h[2] for h in holds)


def _truncate(engine: Any) -> None:
    with raw_transaction(engine) as conn:
        conn.execute(
            "TRUNCATE ledger_entries, usage_lines, events, event_keys, runs, customers CASCADE"
        )


@hypothesis_settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(request_events, min_size=2, max_size=5))
def test_a_group_stores_exactly_what_its_requests_one_by_one_would(engine, prepare, db, batch):
    requests = []
    for events in batch:
        try:
            requests.append(prepare(*events))
        except MeteringError:  # refused before storing (e.g. two customers in one request)
            continue
    assume(len(requests) >= 2)

    _truncate(engine)
    one_by_one = [store_group(engine, [request])[0] for request in requests]
    expected = _snapshot(db)
    _truncate(engine)
    together = store_group(engine, requests)

    assert results(together) == results(one_by_one)
    assert _snapshot(db) == expected
