"""Running the API under uvicorn, with multi-process metrics when there are workers."""

from __future__ import annotations

import os
import tempfile

import uvicorn


def run_api(host: str, port: int, workers: int = 1) -> None:
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
    )
