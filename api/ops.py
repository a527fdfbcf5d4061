"""Health, readiness and metrics."""

from __future__ import annotations

from litestar import Response, get
from litestar.datastructures import State
from litestar.openapi.datastructures import ResponseSpec

from api.metrics import render_metrics
from api.services import Services
from api.wire import Health
from metering.billing import outbox, reconcile, rejections
from metering.db import raw_transaction


@get("/healthz", sync_to_thread=False, tags=["ops"], summary="Liveness")
def healthz() -> Health:
    return Health(status="ok")


@get(
    "/readyz",
    sync_to_thread=True,
    tags=["ops"],
    summary="Readiness: database and Redis",
    responses={503: ResponseSpec(Health, description="A backing service is down")},
)
def readyz(state: State) -> Response[Health]:
    services: Services = state.services
    checks: dict[str, str] = {}
    try:
        with raw_transaction(services.engine) as conn:
            conn.execute("SELECT 1")
        checks["database"] = "ok"
    except Exception as exc:
        checks["database"] = f"down: {exc.__class__.__name__}"
    try:
        services.redis.ping()
        checks["redis"] = "ok"
    except Exception as exc:
        checks["redis"] = f"down: {exc.__class__.__name__}"
    ready = all(v == "ok" for v in checks.values())
    return Response(
        Health(status="ready" if ready else "unavailable", checks=checks),
        status_code=200 if ready else 503,
    )


@get(
    "/metrics",
    sync_to_thread=True,
    tags=["ops"],
    summary="Prometheus metrics",
    media_type="text/plain",
)
def metrics(state: State) -> Response[bytes]:
    services: Services = state.services
    try:
        with raw_transaction(services.engine) as conn:
            counts = outbox.status_counts(conn)
            rejected = rejections.counts_by_code(conn)
            awaiting = reconcile.awaiting_count(conn)
    except Exception:  # metrics must still answer while the database is down
        counts, rejected, awaiting = {}, {}, 0
    body, content_type = render_metrics(counts, rejected, awaiting)
    # Litestar appends "; charset=utf-8" to every text/* type: a second one would make the
    # header ambiguous to strict parsers.
    return Response(body, media_type=content_type.replace("; charset=utf-8", ""))
