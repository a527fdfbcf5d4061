"""What one push round keeps beside its rows: the counts it reports, and the leases and
claims it renews."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass
class PushReport:
    sent_rows: int = 0
    calls: int = 0
    retried: int = 0
    dead: int = 0
    lease_lost: int = 0  # customers left because the lease was not renewed in time
    errors: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, value in counts.items():
                setattr(self, name, getattr(self, name) + value)


class HeldRows:
    """The round's claimed rows it still renews: a customer's leave the set when its rows
    are done with, whatever their state (a row released and claimed again by another
    pusher is that pusher's to renew). ``holder`` names the round's customer leases."""

    def __init__(self, holder: str, rows: Iterable[tuple[int, str, str]]) -> None:
        """``rows``: (outbox id, tenant, customer) of every claimed row."""
        self.holder = holder
        self._customer_of = {row_id: (tenant, customer) for row_id, tenant, customer in rows}
        self._ids = set(self._customer_of)
        self._lost: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def customers(self) -> set[tuple[str, str]]:
        """The customers the round still sends for."""
        with self._lock:
            return {self._customer_of[row_id] for row_id in self._ids}

    def lost(self, customers: Iterable[tuple[str, str]]) -> None:
        """A renewal found these customers' leases no longer ours (lapsed while a renewal
        stalled and taken over): their sending must stop, whatever the heartbeat says."""
        with self._lock:
            self._lost.update(customers)

    def holds(self, tenant: str, customer: str) -> bool:
        with self._lock:
            return (tenant, customer) not in self._lost

    def ids(self) -> list[int]:
        with self._lock:
            return sorted(self._ids)

    def drop(self, ids: Iterable[int]) -> None:
        with self._lock:
            self._ids.difference_update(ids)
