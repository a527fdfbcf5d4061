"""Leases kept alive by their holder (issue #13 §7).

Work claimed in the database (runs a worker settles, the customers a pusher sends to)
carries a lease (``claimed_until``, ``stripe_customer_leases.held_until``): when a holder
dies without a word (SIGKILL, OOM, a lost machine) nothing releases its work, and nobody
else takes it before the lease runs out. A long lease
makes that wait long (it was 120 s); a short one alone would hand a slow but live holder's
work to a second one. So the lease is short and its holder renews it, now and then every
third of its length, from a thread of its own while its work goes on: a killed holder stops
renewing and its work is free one lease after its last renewal, a live one keeps it for as
long as it takes (up to the task's time limit, which kills the holder).

Renewing is what a live holder does, so it is no proof of life to anyone else: whoever
needs *one* holder at a time (the pusher: one Stripe call per customer at a time) asks
``held()`` before each step and stops when its last renewal no longer covers the moment.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from types import TracebackType

log = logging.getLogger("fairmeter.leases")

RENEWALS_PER_LEASE = 3


class Heartbeat:
    """Renews a lease while the ``with`` block runs: once on entry (a failure there is the
    caller's error), then every third of ``lease`` on a daemon thread (a failure there is
    logged and retried at the next beat, while the last renewal still holds).

    ``renew(until)`` sets the holder's leases to end at ``until``; ``clock`` is the time
    the leases are written in (the caller's, so a caller that claims with a given ``now``
    renews from it). ``written_at``: the ``time.monotonic()`` just before the caller wrote
    the lease itself (with the claim), so entering need not write it again."""

    def __init__(
        self,
        renew: Callable[[datetime], object],
        lease: timedelta,
        clock: Callable[[], datetime],
        *,
        name: str = "lease",
        written_at: float | None = None,
    ) -> None:
        self._renew = renew
        self._lease_s = lease.total_seconds()
        self._clock = clock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"{name}-heartbeat", daemon=True)
        self._written_at = written_at
        self._held_until = 0.0  # time.monotonic() at which the last renewal runs out

    def __enter__(self) -> Heartbeat:
        if self._written_at is None:
            self._renew_once()
        else:
            self._held_until = self._written_at + self._lease_s
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        # A renewal still waiting for PostgreSQL is not waited for: it only extends what
        # is still claimed, which its holder is done with either way.
        self._thread.join(timeout=1.0)

    def held(self) -> bool:
        """Whether the lease certainly still holds for another renewal interval."""
        return time.monotonic() + self._lease_s / RENEWALS_PER_LEASE < self._held_until

    def _renew_once(self) -> None:
        began = time.monotonic()  # the lease is counted from before the write, to be safe
        self._renew(self._clock() + timedelta(seconds=self._lease_s))
        self._held_until = began + self._lease_s

    def _beat(self) -> None:
        while not self._stop.wait(self._lease_s / RENEWALS_PER_LEASE):
            try:
                self._renew_once()
            except Exception:
                log.warning("lease renewal failed; retrying at the next beat", exc_info=True)


def elapsed_since(start: datetime) -> Callable[[], datetime]:
    """A clock that starts at ``start`` and moves with real time (monotonic)."""
    began = time.monotonic()
    return lambda: start + timedelta(seconds=time.monotonic() - began)
