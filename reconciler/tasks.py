"""Celery tasks: each a few lines that call a use case in ``metering``.

Messages are sent only after the transaction that produced their work committed, and every
task re-checks the database, so a lost or duplicated message only delays work.
"""

from __future__ import annotations

from metering.settlement.runner import claim_due_chunks, settle_chunk
from reconciler.celery_app import app
from reconciler.engine import engine, settings


@app.task(name="fairmeter.ping")
def ping() -> str:
    """Liveness probe for workers."""
    return "pong"


@app.task(name="fairmeter.sweep_due_runs")
def sweep_due_runs() -> int:
    """Beat, every few seconds: claim due runs (committed), then hand out chunks."""
    chunks = claim_due_chunks(engine(), settings())
    for chunk in chunks:
        settle_run_chunk.delay(chunk)
    return len(chunks)


@app.task(name="fairmeter.settle_run_chunk")
def settle_run_chunk(run_ids: list[int]) -> int:
    report = settle_chunk(engine(), settings(), run_ids)
    return len(report.decided)
