"""What every worker process an API process spawns for heavy work does first.

Two pools run a request's CPU-heavy work outside the API process: the what-if replay's
(``metering/settlement/replay_shards.py``) and an OTLP export's mapping
(``api/cpu_pool.py``). Their workers share two needs, written once here:

- **A lower priority** (``os.nice``), once, for the worker's life: the OS then gives the
  API processes, and so every other tenant's requests, the CPU first, and the heavy work
  what is left (issue #30, docs/reliability.md "Ingest next to a tenant's heavy requests").
- **An end with the API process, however it ends.** uvicorn ends on the SIGTERM it caught,
  raised again after its graceful shutdown, so no exit handler of the API process shuts a
  pool down; a spawned worker waiting for work holds its own end of the call queue's pipe
  and would wait forever. Each worker watches its parent instead.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Final

# How often a worker looks whether its API process is still there.
PARENT_POLL_S: Final = 1.0


def start_worker(nice: int) -> None:
    """A pool's ``initializer``: ``nice`` steps below the process that spawned it, and an
    end with that process."""
    if nice:
        os.nice(nice)
    threading.Thread(
        target=_exit_with, args=(os.getppid(),), name="exit-with-parent", daemon=True
    ).start()


def _exit_with(parent: int) -> None:
    """End this worker once ``parent`` is gone (the worker is then another's child)."""
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os._exit(0)
