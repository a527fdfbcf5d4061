"""Keeping the cyclic garbage collector off the objects a process lives with.

A 1,000-event batch or a 200-run settlement chunk allocates tens of thousands of dicts
and dataclasses, which trigger the collector; each of its full collections walked every
object the process had imported and built at start-up too (modules, classes, the app, its
pools and caches): a fifth of an ingest worker's CPU (docs/benchmarks.md). Those objects
live as long as the process, so scanning them only costs.
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> None:
    """Exempt everything alive now from future collections. Call once per process, after
    its start-up (in the process that will do the work: after a fork, not before).

    Frozen objects are still freed by reference counting; only a cycle among them would
    never be reclaimed, and start-up objects form none that die.
    """
    gc.collect()
    gc.freeze()
