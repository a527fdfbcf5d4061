"""A run-scoped reporter: one method per event type of docs/events.md.

Every method writes its event to the durable spool before it returns and returns the
event's id. Ids are stable (see :mod:`fairmeter_client.ids`): calling a method again with the
same arguments returns the same id and sends nothing new.

Keywords every method takes:

* ``attempt`` — defaults to the run's current attempt: 1, or what :meth:`Run.resumed` last
  set (a process that picks up a resumed run passes ``attempt=`` to ``Meter.run``).
* ``key`` — an extra discriminator for the id, for events the natural key cannot tell
  apart (two model calls in one step without tool call ids).
* ``at`` — when it happened (timezone-aware); default: now. An agent that may report the
  same fact again from *another* host (whose spool does not know the first report) should
  pass the time it recorded with its own state, so the content, not only the id, repeats
  and the server answers "duplicate" rather than 409.

Leaving a ``with meter.run(...)`` block — normally or by an exception — reports nothing by
itself: there is no invented ``run.failed``. A backend that dies mid-run cannot know why,
and a guessed cause would be taken as evidence by the settlement policy. A run without a
terminal event is treated as abandoned after the server's idle timeout (docs/policy.md) and
settled by the rules for abandoned runs (§3: refunded or partly credited with a verified
interruption, else held for review).
"""

from __future__ import annotations

import logging
from datetime import datetime
from types import TracebackType
from typing import Any, Protocol

from fairmeter_client import events as ev
from fairmeter_client.events import Draft

log = logging.getLogger("fairmeter.client")


class Recorder(Protocol):
    def record(self, run: str, customer: str, draft: Draft) -> str: ...


class Run:
    def __init__(self, recorder: Recorder, run_id: str, *, customer: str, attempt: int = 1):
        self.run_id = ev.text("run_id", run_id, limit=200)
        self.customer = ev.text("customer", customer, limit=128)
        self.attempt = ev.attempt(attempt)
        self.terminal_reported = False
        self._recorder = recorder

    def __enter__(self) -> Run:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self.terminal_reported:  # deliberately no invented terminal event
            log.debug("fairmeter: run %s left without a terminal event", self.run_id)

    # -- lifecycle -----------------------------------------------------------------------

    def started(
        self, *, attempt: int | None = None, key: str | None = None, at: datetime | None = None
    ) -> str:
        return self._emit("run.started", attempt, {}, {}, key, at)

    def resumed(
        self,
        *,
        attempt: int,
        from_checkpoint: str | None = None,
        key: str | None = None,
        at: datetime | None = None,
    ) -> str:
        """A new attempt of this run starts (from a checkpoint); later events default to it."""
        self.attempt = ev.attempt(attempt)
        data = {"from_checkpoint": ev.optional_text("from_checkpoint", from_checkpoint)}
        return self._emit("run.resumed", attempt, data, {}, key, at)

    def heartbeat(
        self, *, attempt: int | None = None, key: str | None = None, at: datetime | None = None
    ) -> str:
        return self._emit("run.heartbeat", attempt, {}, {}, key, at)

    def completed(
        self, *, attempt: int | None = None, key: str | None = None, at: datetime | None = None
    ) -> str:
        return self._terminal("run.completed", attempt, {}, key, at)

    def cancelled(
        self,
        *,
        by: str = "user",
        attempt: int | None = None,
        key: str | None = None,
        at: datetime | None = None,
    ) -> str:
        data = {"by": ev.choice("by", by, ev.CANCELLED_BY)}
        return self._terminal("run.cancelled", attempt, data, key, at)

    def failed(
        self,
        *,
        cause: str,
        attempt: int | None = None,
        key: str | None = None,
        at: datetime | None = None,
    ) -> str:
        data = {"cause": ev.choice("cause", cause, ev.FAILURE_CAUSES)}
        return self._terminal("run.failed", attempt, data, key, at)

    # -- work ----------------------------------------------------------------------------

    def usage(
        self,
        *,
        step: int,
        model: str,
        input_tokens: int,
        output_tokens: int,
        cached_input_tokens: int = 0,
        tool_call_id: str | None = None,
        replay: bool = False,
        attempt: int | None = None,
        key: str | None = None,
        at: datetime | None = None,
    ) -> str:
        """One model call. Two calls in one step need a distinct ``tool_call_id`` or ``key``."""
        if not isinstance(replay, bool):
            raise ValueError("replay must be true or false")
        data = {
            "step": ev.step(step),
            "model": ev.text("model", model),
            "input_tokens": ev.count("input_tokens", input_tokens),
            "cached_input_tokens": ev.count("cached_input_tokens", cached_input_tokens),
            "output_tokens": ev.count("output_tokens", output_tokens),
            "tool_call_id": ev.optional_text("tool_call_id", tool_call_id),
            "replay": replay,
        }
        natural = {"step": step, "tool_call_id": tool_call_id, "replay": replay}
        return self._emit("run.usage", attempt, data, natural, key, at)

    def checkpoint(
        self,
        *,
        checkpoint_id: str,
        step: int,
        attempt: int | None = None,
        key: str | None = None,
        at: datetime | None = None,
    ) -> str:
        data = {"checkpoint_id": ev.text("checkpoint_id", checkpoint_id), "step": ev.step(step)}
        return self._emit(
            "run.checkpoint", attempt, data, {"checkpoint_id": checkpoint_id}, key, at
        )

    def delivered(
        self,
        *,
        step: int,
        kind: str = "final",
        attempt: int | None = None,
        key: str | None = None,
        at: datetime | None = None,
    ) -> str:
        data = {"step": ev.step(step), "kind": ev.choice("kind", kind, ev.DELIVERY_KINDS)}
        return self._emit("run.delivered", attempt, data, {"step": step, "kind": kind}, key, at)

    def tool_call(
        self,
        *,
        tool_call_id: str,
        step: int,
        status: str = "completed",
        attempt: int | None = None,
        key: str | None = None,
        at: datetime | None = None,
    ) -> str:
        data = {
            "tool_call_id": ev.text("tool_call_id", tool_call_id),
            "step": ev.step(step),
            "status": ev.choice("status", status, ev.TOOL_STATUSES),
        }
        natural = {"tool_call_id": tool_call_id, "step": step, "status": status}
        return self._emit("run.tool_call", attempt, data, natural, key, at)

    # -- connection telemetry ------------------------------------------------------------

    def connection_lost(
        self,
        *,
        side: str,
        reason: str | None = None,
        attempt: int | None = None,
        key: str | None = None,
        at: datetime | None = None,
    ) -> str:
        """``side="server"``: our infrastructure saw the drop; ``"client"``: the user's app."""
        return self._connection("connection.lost", side, reason, attempt, key, at)

    def connection_restored(
        self,
        *,
        side: str,
        reason: str | None = None,
        attempt: int | None = None,
        key: str | None = None,
        at: datetime | None = None,
    ) -> str:
        return self._connection("connection.restored", side, reason, attempt, key, at)

    # -- internals -----------------------------------------------------------------------

    def _connection(
        self,
        event_type: str,
        side: str,
        reason: str | None,
        attempt: int | None,
        key: str | None,
        at: datetime | None,
    ) -> str:
        data = {
            "side": ev.choice("side", side, ev.SIDES),
            "reason": ev.optional_text("reason", reason),
        }
        return self._emit(event_type, attempt, data, {"side": side}, key, at)

    def _terminal(
        self,
        event_type: str,
        attempt: int | None,
        data: dict[str, Any],
        key: str | None,
        at: datetime | None,
    ) -> str:
        event_id = self._emit(event_type, attempt, data, {}, key, at)
        self.terminal_reported = True
        return event_id

    def _emit(
        self,
        event_type: str,
        attempt: int | None,
        data: dict[str, Any],
        natural_key: dict[str, Any],
        key: str | None,
        at: datetime | None,
    ) -> str:
        chosen = self.attempt if attempt is None else attempt
        draft = ev.draft(event_type, chosen, data, natural_key, key, at)
        return self._recorder.record(self.run_id, self.customer, draft)
