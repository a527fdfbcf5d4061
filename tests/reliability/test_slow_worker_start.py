"""A served API worker that stalls for a few seconds is not killed by its supervisor.

uvicorn pings every worker and kills one that does not answer within
``timeout_worker_healthcheck`` (5 s by default), also while it is starting or stalled. On a
loaded 2-core host a worker importing the app, or starved of CPU, missed that deadline, was
killed and restarted, and the API dropped what it was serving or never came up. Workers now
get ``FAIRMETER_WORKER_START_TIMEOUT_S`` (120 s). The test stalls one worker (SIGSTOP) for
longer than uvicorn's default and checks the supervisor kept it.
"""

from __future__ import annotations

import os
import signal
import time

import httpx
import psutil

from tests.security.harness import serve

STALL_S = 8  # longer than uvicorn's default 5 s health check


def api_workers(served_port: int) -> list[psutil.Process]:
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if "serve" in cmdline and str(served_port) in cmdline:
            return proc.children()
    return []


def test_a_worker_stalled_longer_than_uvicorns_default_health_check_is_kept(settings, tmp_path):
    with serve(settings, tmp_path, workers=2) as served:
        port = int(served.base.rsplit(":", 1)[1])
        workers = [w for w in api_workers(port) if "--multiprocessing-fork" in w.cmdline()]
        assert len(workers) == 2
        stalled = workers[0]
        os.kill(stalled.pid, signal.SIGSTOP)
        try:
            time.sleep(STALL_S)
        finally:
            os.kill(stalled.pid, signal.SIGCONT)
        time.sleep(1)
        assert stalled.is_running() and stalled.status() != psutil.STATUS_ZOMBIE
        assert {w.pid for w in api_workers(port)} >= {stalled.pid}
        assert httpx.get(f"{served.base}/healthz", timeout=10).status_code == 200
