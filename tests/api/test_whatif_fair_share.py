"""The what-if workers an API process shares between tenants are shared fairly (issue #30,
"Fair share"; docs/reliability.md): while one tenant's large what-if runs, another tenant's
small one waits for a worker at most until one of the large one's shards ends, not until
all of it is done (metering/settlement/replay_pool.py).

The API is served (one uvicorn process, two what-if workers). A period counts as large from
1,000 runs here and is split into shards of 250 runs (the settings), so tenant A's 16,000
runs are 64 shards: 1,000 settled for real, then copied in SQL with their decisions (the
replay reads only runs and the decisions' recorded facts), which keeps the test fast.
Nothing is timed against a constant: the bound on B's wait is measured on this machine
from A's what-if alone and the share of it one shard is (the settings' shard size).
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg
import pytest

from metering.config import Settings
from metering.settlement.runner import settle_due_now
from tests.api.heavy_harness import PATIENCE_S, PROMPT_S, Pending
from tests.api.test_whatif_workers import worker_pids
from tests.helpers.ingest import ingest
from tests.helpers.processes import wait_until
from tests.helpers.scenarios import KINDS, scenario
from tests.security.harness import Served, serve

PROCESSES = 2
FROM_RUNS = 1_000
SHARD_RUNS = 250
SETTLED_RUNS = 1_000  # tenant A's runs settled for real
COPIES = 15  # and copied, to 16,000 runs
CANDIDATE = {"rules": {"R4": False}}
# A shard's share of A's time is measured with A alone; next to A, B may wait for a few
# shards' time on a loaded machine (slower than when A ran alone), never for half of A.
SHARDS_OF_SLACK = 8


@pytest.fixture(scope="module")
def api(settings: Settings, tmp_path_factory: Any) -> Iterator[Served]:
    with serve(
        settings,
        tmp_path_factory.mktemp("whatif-fair-share"),
        FAIRMETER_HEAVY_SLOTS_REDIS_PREFIX=f"fairmeter-test:slots:{uuid.uuid4().hex}",
        FAIRMETER_WHATIF_TIMEOUT_S=str(PATIENCE_S),
        FAIRMETER_WHATIF_PROCESSES=str(PROCESSES),
        FAIRMETER_WHATIF_PARALLEL_FROM_RUNS=str(FROM_RUNS),
        FAIRMETER_WHATIF_SHARD_RUNS=str(SHARD_RUNS),
    ) as served:
        yield served


def settled(engine: Any, settings: Settings, tenant: str, runs: int, start: datetime) -> None:
    """``runs`` runs of every kind, of 400 customers (shards of even size), ingested and
    settled."""
    kinds = sorted(KINDS)
    events = [
        event
        for i in range(runs)
        for event in scenario(kinds[i % len(kinds)], f"run-{i}", f"cust-{i % 400}", start)
    ]
    for first in range(0, len(events), 5_000):
        ingest(engine, settings, events[first : first + 5_000], tenant=tenant)
    settle_due_now(engine, settings, now=datetime.now(UTC))


def copied(db: psycopg.Connection[Any], tenant: str, copies: int) -> None:
    """Each of ``tenant``'s runs copied ``copies`` times (subject ``<run>~<n>``) with its
    decisions: what a what-if replays, without ingesting and settling each again."""
    runs = [c for c in columns(db, "runs") if c not in ("id", "subject")]
    decisions = [c for c in columns(db, "decisions") if c not in ("id", "run_id")]
    db.execute(
        f"""
        WITH copies AS (
            INSERT INTO runs (subject, {", ".join(runs)})
            SELECT r.subject || '~' || n, {", ".join(f"r.{c}" for c in runs)}
            FROM runs r, generate_series(1, %(copies)s) n WHERE r.tenant_id = %(tenant)s
            RETURNING id, subject
        )
        INSERT INTO decisions (run_id, {", ".join(decisions)})
        SELECT c.id, {", ".join(f"d.{col}" for col in decisions)}
        FROM copies c
        JOIN runs r ON r.tenant_id = %(tenant)s AND r.subject = split_part(c.subject, '~', 1)
        JOIN decisions d ON d.tenant_id = r.tenant_id AND d.run_id = r.id
        """,
        {"tenant": tenant, "copies": copies},
    )


def columns(db: psycopg.Connection[Any], table: str) -> list[str]:
    rows = db.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = %s"
        " AND table_schema = current_schema() ORDER BY ordinal_position",
        (table,),
    ).fetchall()
    return [name for (name,) in rows]


def what_if(base: str, key: str, period: str) -> httpx.Response:
    return httpx.post(
        f"{base}/v1/policy/what-if",
        headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
        content=json.dumps({"period": period, "document": CANDIDATE}),
        timeout=PATIENCE_S,
    )


def timed(base: str, key: str, period: str) -> tuple[float, dict[str, Any]]:
    began = time.monotonic()
    reply = what_if(base, key, period)
    assert reply.status_code == 200, reply.text
    return time.monotonic() - began, reply.json()


def test_another_tenants_small_what_if_waits_for_one_shard_of_a_large_one_not_all_of_it(
    api, make_key, engine, settings, db
):
    start = datetime.now(UTC) - timedelta(minutes=30)
    period = f"{start + timedelta(minutes=4):%Y-%m}"  # the runs' end's month
    settled(engine, settings, "big", SETTLED_RUNS, start)
    copied(db, "big", COPIES)
    ingest(engine, settings, scenario("server-drop", "drop", "cust-1", start), tenant="small")
    ingest(engine, settings, scenario("completed", "ok", "cust-2", start), tenant="small")
    settle_due_now(engine, settings, now=datetime.now(UTC))
    big, small = make_key(tenant="big", scope="admin"), make_key(tenant="small", scope="admin")

    timed(api.base, small, period)  # the workers have started
    small_alone_s = max(timed(api.base, small, period)[0] for _ in range(2))
    big_alone_s, big_alone = timed(api.base, big, period)
    assert big_alone["runs"] == SETTLED_RUNS * (COPIES + 1)
    shards = math.ceil(big_alone["runs"] / SHARD_RUNS)
    bound_s = small_alone_s + SHARDS_OF_SLACK * big_alone_s / shards

    big_next = Pending(what_if, api.base, big, period)
    assert wait_until(lambda: len(worker_pids(db)) >= PROCESSES, PROMPT_S), "A's what-if idles"
    waited_s, reply = timed(api.base, small, period)
    assert big_next.running(), "A's what-if was over before B's: nothing was shared"
    assert waited_s <= bound_s, (
        f"B's what-if took {waited_s:.2f} s next to A's ({big_alone_s:.2f} s alone, "
        f"{shards} shards; B alone {small_alone_s:.2f} s): more than {bound_s:.2f} s"
    )
    assert reply == timed(api.base, small, period)[1]  # as alone, to the unit
    billed, credited = db.execute(
        "SELECT sum(billed_micros), sum(credited_micros) FROM runs WHERE tenant_id = 'small'"
    ).fetchone()
    current = reply["total"]["current"]
    assert (current["billed_micros"], current["credited_micros"]) == (billed, credited)
    assert reply["total"]["candidate"]["credited_micros"] == 0 < credited
    assert reply["changes"] == [
        {"old_outcome": "refunded", "new_outcome": "confirmed", "runs": 1, "example_runs": ["drop"]}
    ]
    assert big_next.reply().json() == big_alone
