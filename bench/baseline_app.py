"""The baseline for single-event ingest: a bare Litestar endpoint, one INSERT per request.

It parses the same CloudEvent, hashes it and stores it in a table shaped like ``events``
(same columns, same UNIQUE natural key, JSONB attributes and data) with one autocommitted
``INSERT … ON CONFLICT DO NOTHING`` from a psycopg async pool: what the simplest correct
endpoint would cost. Run under uvicorn like the real API::

    BENCH_DATABASE_URL=postgresql://... uvicorn bench.baseline_app:create_app --factory
"""

from __future__ import annotations

import hashlib
import os
from datetime import UTC, datetime
from typing import Any

import msgspec
from litestar import Litestar, Request, post
from litestar.datastructures import State
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

TABLE_DDL = """
CREATE TABLE IF NOT EXISTS bare_events (
    id bigserial PRIMARY KEY,
    tenant_id varchar(64) NOT NULL,
    source varchar(255) NOT NULL,
    event_id varchar(255) NOT NULL,
    type varchar(64) NOT NULL,
    subject varchar(200) NOT NULL,
    time timestamptz NOT NULL,
    received_at timestamptz NOT NULL,
    body_hash bytea NOT NULL,
    attributes jsonb NOT NULL,
    data jsonb NOT NULL,
    UNIQUE (tenant_id, source, event_id)
)
"""

INSERT = """
INSERT INTO bare_events (tenant_id, source, event_id, type, subject, time, received_at,
                         body_hash, attributes, data)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT DO NOTHING
"""


@post("/v1/events", status_code=200)
async def post_event(request: Request[Any, Any, Any], state: State) -> dict[str, int]:
    body = await request.body()
    event = msgspec.json.decode(body)
    data = event.pop("data")
    async with state.pool.connection() as conn:
        cur = await conn.execute(
            INSERT,
            (
                "bench",
                event["source"],
                event["id"],
                event["type"],
                event["subject"],
                datetime.fromisoformat(event["time"]),
                datetime.now(UTC),
                hashlib.sha256(body).digest(),
                Jsonb(event),
                Jsonb(data),
            ),
        )
    return {"accepted": cur.rowcount, "duplicates": 1 - cur.rowcount}


def create_app() -> Litestar:
    pool = AsyncConnectionPool(
        os.environ["BENCH_DATABASE_URL"],
        min_size=4,
        max_size=int(os.environ.get("BENCH_POOL_SIZE", "16")),
        kwargs={"autocommit": True},
        open=False,
    )

    async def startup() -> None:
        await pool.open(wait=True)

    async def shutdown() -> None:
        await pool.close()

    return Litestar(
        route_handlers=[post_event],
        state=State({"pool": pool}),
        on_startup=[startup],
        on_shutdown=[shutdown],
        debug=False,
    )
