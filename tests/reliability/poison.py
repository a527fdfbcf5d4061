"""A poison task for the dead-letter test: it kills the worker process that runs it, each
time it is delivered, as a message that crashes a native library or exhausts memory would.
Loaded only by that test's worker (``--include``)."""

from __future__ import annotations

import os
import signal

from reconciler.celery_app import app

POISON_TASK = "fairmeter.test.poison"


@app.task(name=POISON_TASK)
def poison() -> None:
    os.kill(os.getpid(), signal.SIGKILL)
