"""Celery tasks: each a few lines that call a use case in ``metering``."""

from __future__ import annotations

from reconciler.celery_app import app


@app.task(name="fairmeter.ping")
def ping() -> str:
    """Liveness probe for workers (used by the launcher's readiness check)."""
    return "pong"
