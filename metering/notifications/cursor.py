"""What a live stream has sent, so each notification goes out once in whatever order the
fan-out, a catch-up from the table, or both at once offer it — and a resume token that
carries that memory to the next connection.

A notification's id is handed out when its transaction inserts it, not when it commits. For
one run the two orders agree (every change to a run holds the run's row lock until it
commits), but two runs of one customer change concurrently: the change that commits second
can carry the lower id. So a stream must not drop everything at or below the highest id it
sent. It remembers the ids it sent recently, a bounded window, and drops only those (and the
id it started from, which the client already has); an id older than the whole window counts
as sent.

The same holds across a reconnect. A client that resumed from "the highest id I saw" would
miss a lower-numbered notification that committed while it was away, so each event's SSE
``id:`` is a *resume token*: a floor (everything at or below it counts as sent) and the ids
sent above it, at most :data:`TOKEN_IDS` of them (:meth:`StreamCursor.token`). A stream
resumed from a token reads the table after the floor and skips the listed ids
(:meth:`StreamCursor.resumed`): a late notification is sent once, on whichever connection
sees it first. A plain integer is a token too — the floor alone, as every opening event
carries and as older clients send.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterable, Sequence

from metering.notifications.replay import StoredNotification

# How many sent ids a stream remembers: far more than the notifications of one customer
# that commit while an earlier-numbered one of theirs is still in flight.
WINDOW = 256
# How many of them a resume token lists: enough for the notifications of one customer that
# commit while one of theirs is in flight *and* the client is reconnecting, and short enough
# for a header (each id costs a few characters; consecutive ids are one item).
TOKEN_IDS = 32
# A token longer than this is refused: it cannot have come from this server.
TOKEN_MAX_CHARS = 1024


class InvalidToken(ValueError):
    """Not a resume token this server hands out."""


class StreamCursor:
    """The ids one stream has sent. Pure state; the stream owns one."""

    def __init__(self, start_id: int, *, window: int = WINDOW, sent: Sequence[int] = ()) -> None:
        self._start_id = start_id  # the client has it (resumed after it, or its snapshot)
        # Sent ids at or below this have left the window. A resumed token's floor counts as
        # sent too, as everything below it did on the connection that made the token.
        self._forgotten = start_id if sent else 0
        self._window = window
        self._recent: set[int] = set(sent)
        self._oldest: list[int] = sorted(sent)  # a min-heap (sorted is one), to forget
        self._ascending: list[int] = sorted(sent)  # the same ids in order, for tokens
        self.last_id = max([start_id, *sent])  # the highest id sent

    @classmethod
    def resumed(cls, token: str, *, window: int = WINDOW) -> StreamCursor:
        """The cursor a token describes (:class:`InvalidToken` if it is not one)."""
        floor, sent = parse_token(token)
        return cls(floor, window=window, sent=sent)

    @property
    def horizon(self) -> int:
        """Where a catch-up from the table reads after: the start, or the oldest id the
        window still remembers, so a late one among the recent ids is found too."""
        return max(self._start_id, self._forgotten)

    def token(self) -> str:
        """Where a client resumes from after what has been sent so far."""
        floor = self.horizon
        above = self._ascending[bisect.bisect_right(self._ascending, floor) :]
        if len(above) > TOKEN_IDS:
            floor, above = above[-TOKEN_IDS - 1], above[-TOKEN_IDS:]
        return format_token(floor, above)

    def take(
        self, notifications: Iterable[StoredNotification]
    ) -> list[tuple[StoredNotification, str]]:
        """The notifications not sent yet, by id, each with the resume token that holds once
        it has been sent; they count as sent from now on."""
        fresh: list[tuple[StoredNotification, str]] = []
        for n in sorted(notifications, key=lambda n: n.id):
            if n.id <= self._forgotten or n.id == self._start_id or n.id in self._recent:
                continue
            self._recent.add(n.id)
            heapq.heappush(self._oldest, n.id)
            bisect.insort(self._ascending, n.id)
            self.last_id = max(self.last_id, n.id)
            self._forget_beyond_window()
            fresh.append((n, self.token()))
        return fresh

    def _forget_beyond_window(self) -> None:
        while len(self._oldest) > self._window:
            forgotten = heapq.heappop(self._oldest)
            self._recent.discard(forgotten)
            self._ascending.remove(forgotten)
            self._forgotten = max(self._forgotten, forgotten)


# The token's text: ``<floor>`` alone, or ``<floor>.<item>.<item>…`` where each item is the
# distance from the previous id (the floor, first) in base 36, optionally ``-<n>`` for n more
# ids each one above the last. Example: floor 10, sent 12, 13, 14 and 20 → ``10.2-2.6``.


def format_token(floor: int, sent_above: Sequence[int]) -> str:
    items: list[str] = []
    previous = floor
    run_start = 0
    index = 0
    while index < len(sent_above):
        run_start = index
        while index + 1 < len(sent_above) and sent_above[index + 1] == sent_above[index] + 1:
            index += 1
        gap = _base36(sent_above[run_start] - previous)
        extra = index - run_start
        items.append(f"{gap}-{_base36(extra)}" if extra else gap)
        previous = sent_above[index]
        index += 1
    return ".".join([str(floor), *items])


def parse_token(token: str) -> tuple[int, list[int]]:
    """The floor and the ids sent above it."""
    text = token.strip()
    if not text or len(text) > TOKEN_MAX_CHARS or not text.isascii():
        raise InvalidToken(token)
    head, *items = text.split(".")
    if not head.isdigit() or len(head) > 18:
        raise InvalidToken(token)
    floor = int(head)
    sent: list[int] = []
    previous = floor
    for item in items:
        gap_text, dash, extra_text = item.partition("-")
        gap = _from_base36(gap_text)
        extra = _from_base36(extra_text) if dash else 0
        if gap < 1 or len(sent) + extra + 1 > TOKEN_IDS:
            raise InvalidToken(token)
        first = previous + gap
        sent.extend(range(first, first + extra + 1))
        previous = sent[-1]
    if previous >= 10**18:
        raise InvalidToken(token)
    return floor, sent


_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"


def _base36(value: int) -> str:
    if value == 0:
        return "0"
    out = []
    while value:
        value, digit = divmod(value, 36)
        out.append(_DIGITS[digit])
    return "".join(reversed(out))


def _from_base36(text: str) -> int:
    if not text or len(text) > 12 or any(c not in _DIGITS for c in text):
        raise InvalidToken(text)
    return int(text, 36)
