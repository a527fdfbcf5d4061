"""Running the API under uvicorn, with multi-process metrics when there are workers."""

from __future__ import annotations

import os
import tempfile

import uvicorn

from metering.config import Settings


def run_api(settings: Settings, host: str, port: int, workers: int = 1) -> None:
    """Serve ``api.app:create_served_app``. Forwarded headers (X-Forwarded-For, -Proto) are
    believed only from ``trusted_proxies``, by the app itself (api/forwarded.py): it puts the
    forwarded client in the ASGI scope, which is what the rate limiter counts, and warns
    once about an untrusted peer that forwards. uvicorn's own ``proxy_headers`` stays off:
    the app could not see the connecting peer any more. Believed from anyone, the header
    would let a client pick a fresh address per request and walk around the anonymous
    limit."""
    if workers > 1 and "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        # prometheus_client reads this variable itself; each worker writes its own files.
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="fairmeter-metrics-")
    uvicorn.run(
        "api.app:create_served_app",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_level="warning",
        access_log=False,
        proxy_headers=False,
        # uvicorn pings each worker and kills one that does not answer in time, also while
        # it is still starting: too short, and a slow start becomes an endless restart.
        timeout_worker_healthcheck=settings.worker_start_timeout_s,
        # Live status streams never end on their own: without a limit a SIGTERM would wait
        # for every client to hang up.
        timeout_graceful_shutdown=settings.shutdown_grace_s,
    )
