"""What a live stream has sent, so each notification goes out once in whatever order the
fan-out, a catch-up from the table, or both at once offer it.

A notification's id is handed out when its transaction inserts it, not when it commits. For
one run the two orders agree (every change to a run holds the run's row lock until it
commits), but two runs of one customer change concurrently: the change that commits second
can carry the lower id. So a stream must not drop everything at or below the highest id it
sent. It remembers the ids it sent recently, a bounded window, and drops only those (and the
id it started from, which the client already has); an id older than the whole window counts
as sent.

A late notification is sent without advancing :attr:`StreamCursor.last_id`, the position
the client resumes from, so a resumed stream never repeats the higher ids sent before it.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

from metering.notifications.replay import StoredNotification

# How many sent ids a stream remembers: far more than the notifications of one customer
# that commit while an earlier-numbered one of theirs is still in flight.
WINDOW = 256


class StreamCursor:
    """The ids one stream has sent. Pure state; the stream owns one."""

    def __init__(self, start_id: int, *, window: int = WINDOW) -> None:
        self.last_id = start_id  # the highest id sent: the client's Last-Event-ID
        self._start_id = start_id  # the client has it (resumed after it, or its snapshot)
        self._forgotten = 0  # sent ids at or below this have left the window
        self._window = window
        self._recent: set[int] = set()
        self._oldest: list[int] = []  # the same ids as a min-heap, to forget the oldest

    @property
    def horizon(self) -> int:
        """Where a catch-up from the table reads after: the start, or the oldest id the
        window still remembers, so a late one among the recent ids is found too."""
        return max(self._start_id, self._forgotten)

    def take(
        self, notifications: Iterable[StoredNotification]
    ) -> list[tuple[StoredNotification, bool]]:
        """The notifications not sent yet, by id, each with whether it advances
        :attr:`last_id` (a late one does not); they count as sent from now on."""
        fresh: list[tuple[StoredNotification, bool]] = []
        for n in sorted(notifications, key=lambda n: n.id):
            if n.id <= self._forgotten or n.id == self._start_id or n.id in self._recent:
                continue
            self._recent.add(n.id)
            heapq.heappush(self._oldest, n.id)
            advances = n.id > self.last_id
            self.last_id = max(self.last_id, n.id)
            fresh.append((n, advances))
        while len(self._oldest) > self._window:
            forgotten = heapq.heappop(self._oldest)
            self._recent.discard(forgotten)
            self._forgotten = max(self._forgotten, forgotten)
        return fresh
