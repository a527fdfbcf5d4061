"""The client's errors. Each one says what the caller can do about it."""

from __future__ import annotations


class MeterError(Exception):
    """Base class of every error the Fairmeter client raises."""


class SpoolFullError(MeterError):
    """The spool reached ``max_events`` or ``max_spool_bytes``; the event was NOT recorded.

    Pending events and dead letters both count: deliver (is the API reachable?) or clear
    dead letters to make room.
    """


class SpoolLockedError(MeterError):
    """Another live process holds this spool file; one process per spool."""


class EventConflictError(MeterError, ValueError):
    """The same natural key (so the same event id) was reported with different content.

    Raised at call time instead of letting the server answer 409 later: two different
    usages of one step need distinct keys (``tool_call_id`` or ``key=``).
    """


class MeterConfigError(MeterError):
    """The server refused the client itself (401/403/404…): the key, scope or URL is wrong.

    Sending stops and every event stays in the spool; fix the configuration and call
    ``Meter.resume()`` (or restart the process).
    """

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(f"HTTP {status} {code}: {detail}")
        self.status = status
        self.code = code
        self.detail = detail


class StreamRefusedError(MeterError):
    """The server refused to open a status stream (401, 403, 404, 422…): the key, its scope,
    the run or customer, or the resume id is wrong for it. Following stops; retrying the
    same request would be refused again."""

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(f"HTTP {status} {code}: {detail}")
        self.status = status
        self.code = code
        self.detail = detail
