"""Seeded, pure generation of agent runs: what each kind of run reports, call by call.

A run is a list of :class:`Call` — a method of :class:`fairmeter_client.Run` and its keyword
arguments, ``at`` (when it happened) included. Nothing here touches a clock, a file or the
network: the same ``random.Random`` state gives the same calls. Every call carries an
explicit natural key (``key=``), so event ids never depend on the spool's per-run sequence.

Each :class:`Kind` has the outcome docs/policy.md gives it by construction (``INTENDED``); the
expected-outcome module computes it independently with the policy and a test checks that
both agree.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Final

from metering.policy import CONFIRMED, HELD_FOR_REVIEW, PARTIALLY_CREDITED, REFUNDED

MODELS: Final = ("agent-small-1", "agent-large-1", "agent-reasoner-2")
MODEL_WEIGHTS: Final = (5, 4, 1)


class Kind(StrEnum):
    COMPLETED = "completed"
    DUPLICATE_TOOL_CALL = "duplicate-tool-call"  # R1
    CLIENT_RECONNECT = "client-reconnect"  # client drop, restored, completed: R0
    SERVER_BLIP = "server-blip"  # server drop, restored in the same attempt: R0
    RESUMED = "resumed"  # server drop, resume from checkpoint, replay + redo: R2, R3
    SERVER_SIDE_FAILURE = "server-side-failure"  # provider/server/network, no delivery: R4
    PARTIAL_THEN_DROP = "partial-then-drop"  # delivery, server drop, failure: R5
    TOOL_FAILURE = "tool-failure"  # not protected: R0, charged
    CLIENT_FAILURE = "client-failure"  # client-side evidence only: R7
    UNKNOWN_FAILURE = "unknown-failure"  # R7
    USER_CANCEL = "user-cancel"  # R6
    SYSTEM_CANCEL = "system-cancel"  # R6 → server failure → R4
    ABANDONED_AFTER_DROP = "abandoned-after-drop"  # no terminal event, server drop: R4
    ABANDONED_SILENT = "abandoned-silent"  # no terminal event, no interruption: R7


INTENDED: Final = {
    Kind.COMPLETED: CONFIRMED,
    Kind.DUPLICATE_TOOL_CALL: PARTIALLY_CREDITED,
    Kind.CLIENT_RECONNECT: CONFIRMED,
    Kind.SERVER_BLIP: CONFIRMED,
    Kind.RESUMED: PARTIALLY_CREDITED,
    Kind.SERVER_SIDE_FAILURE: REFUNDED,
    Kind.PARTIAL_THEN_DROP: PARTIALLY_CREDITED,
    Kind.TOOL_FAILURE: CONFIRMED,
    Kind.CLIENT_FAILURE: HELD_FOR_REVIEW,
    Kind.UNKNOWN_FAILURE: HELD_FOR_REVIEW,
    Kind.USER_CANCEL: CONFIRMED,
    Kind.SYSTEM_CANCEL: REFUNDED,
    Kind.ABANDONED_AFTER_DROP: REFUNDED,
    Kind.ABANDONED_SILENT: HELD_FOR_REVIEW,
}
INTERRUPTED_KINDS: Final = (
    Kind.CLIENT_RECONNECT,
    Kind.SERVER_BLIP,
    Kind.RESUMED,
    Kind.SERVER_SIDE_FAILURE,
    Kind.PARTIAL_THEN_DROP,
    Kind.TOOL_FAILURE,
    Kind.CLIENT_FAILURE,
    Kind.UNKNOWN_FAILURE,
)
ABANDONED_KINDS: Final = (Kind.ABANDONED_AFTER_DROP, Kind.ABANDONED_SILENT)


@dataclass(frozen=True)
class Rates:
    """Shares of the traffic; what is left over completes cleanly."""

    interrupt: float = 0.35  # drops, resumes, failures (INTERRUPTED_KINDS)
    cancel: float = 0.08  # three quarters by the user, the rest by the system
    abandon: float = 0.06  # no terminal event
    duplicate: float = 0.10  # clean runs that re-execute a completed tool call

    def __post_init__(self) -> None:
        shares = (self.interrupt, self.cancel, self.abandon, self.duplicate)
        if min(shares) < 0 or sum(shares) > 1:
            raise ValueError("rates must be ≥ 0 and add up to at most 1")


def choose_kind(rng: random.Random, rates: Rates) -> Kind:
    roll = rng.random()
    if roll < rates.abandon:
        return rng.choice(ABANDONED_KINDS)
    roll -= rates.abandon
    if roll < rates.cancel:
        return Kind.USER_CANCEL if rng.random() < 0.75 else Kind.SYSTEM_CANCEL
    roll -= rates.cancel
    if roll < rates.interrupt:
        return rng.choice(INTERRUPTED_KINDS)
    roll -= rates.interrupt
    return Kind.DUPLICATE_TOOL_CALL if roll < rates.duplicate else Kind.COMPLETED


@dataclass(frozen=True)
class Call:
    """One method call on :class:`fairmeter_client.Run`."""

    method: str
    kwargs: dict[str, Any]

    @property
    def at(self) -> datetime:
        moment: datetime = self.kwargs["at"]
        return moment


@dataclass(frozen=True)
class Scenario:
    run_id: str
    customer: str
    kind: Kind
    calls: tuple[Call, ...]

    @property
    def ended_at(self) -> datetime:
        return self.calls[-1].at

    def shifted(self, delta: timedelta) -> Scenario:
        calls = tuple(replace(c, kwargs={**c.kwargs, "at": c.at + delta}) for c in self.calls)
        return replace(self, calls=calls)


@dataclass
class Script:
    """Writes one run's calls with a clock that only moves forward (every time distinct)."""

    rng: random.Random
    now: datetime
    calls: list[Call] = field(default_factory=list)
    attempt: int = 1
    counter: int = 0
    completed_tools: list[tuple[int, str]] = field(default_factory=list)  # (step, id)
    saved_step: int | None = None  # the last checkpoint's step

    def add(self, method: str, *, pause_s: tuple[float, float] = (0.5, 20.0), **kw: Any) -> None:
        low, high = pause_s
        self.now += timedelta(milliseconds=self.rng.randint(int(low * 1000), int(high * 1000)))
        self.calls.append(Call(method, {**kw, "at": self.now}))

    def key(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}-{self.counter}"

    def usage(self, step: int, *, tool_call_id: str | None = None, replay: bool = False) -> None:
        model = self.rng.choices(MODELS, MODEL_WEIGHTS)[0]
        input_tokens = self.rng.randint(200, 6000)
        cached = self.rng.randint(0, input_tokens // 2) if self.rng.random() < 0.4 else 0
        extra: dict[str, Any] = {"tool_call_id": tool_call_id} if tool_call_id else {}
        self.add(
            "usage",
            pause_s=(2.0, 45.0),
            step=step,
            model=model,
            input_tokens=input_tokens,
            cached_input_tokens=cached,
            output_tokens=self.rng.randint(30, 900),
            replay=replay,
            key=self.key("call"),
            **extra,
        )

    def work(self, steps: range, *, tool_rate: float = 0.4, checkpoint_rate: float = 0.35) -> None:
        """Model calls, tool calls and checkpoints for ``steps`` in the current attempt."""
        for step in steps:
            for _ in range(self.rng.randint(1, 2)):
                self.usage(step)
            if self.rng.random() < tool_rate:
                self.tool(step)
            if self.rng.random() < checkpoint_rate:
                self.checkpoint(step)
            if self.rng.random() < 0.1:
                self.add("heartbeat", key=self.key("hb"))

    def tool(self, step: int, status: str = "completed") -> str:
        tool_call_id = f"tc-{step}-{self.counter + 1}"
        self.usage(step, tool_call_id=tool_call_id)
        self.add("tool_call", tool_call_id=tool_call_id, step=step, status=status)
        if status == "completed":
            self.completed_tools.append((step, tool_call_id))
        return tool_call_id

    def checkpoint(self, step: int) -> None:
        self.add("checkpoint", checkpoint_id=f"ck-{self.attempt}-{step}", step=step)
        self.saved_step = step

    def drop(self, side: str, reason: str) -> None:
        self.add("connection_lost", side=side, reason=reason, key=self.key("drop"))

    def restore(self, side: str) -> None:
        self.add("connection_restored", side=side, key=self.key("restore"), pause_s=(1.0, 30.0))

    def deliver(self, step: int, kind: str) -> None:
        self.add("delivered", step=step, kind=kind)


SERVER_DROPS: Final = ("pod evicted", "gateway restart", "upstream reset")
CLIENT_DROPS: Final = ("wifi lost", "laptop asleep", "tab closed")


def _finish(script: Script, steps: int) -> None:
    script.deliver(steps, "final")
    script.add("completed")


def _resumed(script: Script, steps: int) -> None:
    # Work, a checkpoint, more work that the drop loses, then attempt 2 replays the saved
    # context (R2), redoes the lost steps (R3) and finishes.
    saved = script.rng.randint(1, steps - 2)
    script.work(range(1, saved + 1), checkpoint_rate=0)
    script.checkpoint(saved)
    lost_until = script.rng.randint(saved + 1, steps - 1)
    script.work(range(saved + 1, lost_until + 1), checkpoint_rate=0)
    script.drop("server", script.rng.choice(SERVER_DROPS))
    script.attempt = 2
    script.add("resumed", attempt=2, from_checkpoint=f"ck-1-{saved}", pause_s=(5.0, 60.0))
    for _ in range(script.rng.randint(1, 2)):
        script.usage(saved, replay=True)
    script.work(range(saved + 1, steps + 1))
    _finish(script, steps)


def _partial_then_drop(script: Script, steps: int) -> None:
    delivered = script.rng.randint(1, steps - 1)
    script.work(range(1, delivered + 1))
    script.deliver(delivered, script.rng.choice(("partial", "changes")))
    script.work(range(delivered + 1, steps + 1))
    script.drop("server", script.rng.choice(SERVER_DROPS))
    script.add("failed", cause="network")


def _duplicate_tool_call(script: Script, steps: int) -> None:
    script.work(range(1, steps + 1))
    if not script.completed_tools:
        script.tool(steps)
    step, tool_call_id = script.rng.choice(script.completed_tools)
    # The agent retries a tool it already ran (a lost tool reply): a second model call with
    # the same tool call id, after the tool call completed.
    script.usage(step, tool_call_id=tool_call_id)
    _finish(script, steps)


def _with_drop(script: Script, steps: int, side: str, reasons: tuple[str, ...]) -> None:
    middle = script.rng.randint(1, steps - 1)
    script.work(range(1, middle + 1))
    script.drop(side, script.rng.choice(reasons))
    script.restore(side)
    script.work(range(middle + 1, steps + 1))
    _finish(script, steps)


def _failure(script: Script, steps: int, cause: str) -> None:
    script.work(range(1, steps + 1))
    if cause == "tool":
        script.tool(steps, status="failed")
    if cause == "client":
        script.drop("client", script.rng.choice(CLIENT_DROPS))
    if cause == "network":
        script.drop("server", script.rng.choice(SERVER_DROPS))
    script.add("failed", cause=cause)


def _body(script: Script, kind: Kind, steps: int) -> None:
    rng = script.rng
    if kind is Kind.RESUMED:
        _resumed(script, steps)
    elif kind is Kind.PARTIAL_THEN_DROP:
        _partial_then_drop(script, steps)
    elif kind is Kind.DUPLICATE_TOOL_CALL:
        _duplicate_tool_call(script, steps)
    elif kind is Kind.CLIENT_RECONNECT:
        _with_drop(script, steps, "client", CLIENT_DROPS)
    elif kind is Kind.SERVER_BLIP:
        _with_drop(script, steps, "server", SERVER_DROPS)
    elif kind is Kind.SERVER_SIDE_FAILURE:
        _failure(script, steps, rng.choice(("provider", "server", "network")))
    elif kind in (Kind.TOOL_FAILURE, Kind.CLIENT_FAILURE, Kind.UNKNOWN_FAILURE):
        _failure(script, steps, kind.value.removesuffix("-failure"))
    elif kind in (Kind.USER_CANCEL, Kind.SYSTEM_CANCEL):
        script.work(range(1, steps + 1))
        script.add("cancelled", by="user" if kind is Kind.USER_CANCEL else "system")
    elif kind is Kind.ABANDONED_AFTER_DROP:
        script.work(range(1, steps + 1))
        script.drop("server", rng.choice(SERVER_DROPS))
    elif kind is Kind.ABANDONED_SILENT:
        script.work(range(1, steps + 1))
    else:
        script.work(range(1, steps + 1))
        if rng.random() < 0.3:
            script.deliver(rng.randint(1, steps), "changes")
        _finish(script, steps)


def build_scenario(
    kind: Kind, run_id: str, customer: str, rng: random.Random, *, ends_at: datetime
) -> Scenario:
    """The calls of one run of ``kind``, its last call at ``ends_at``."""
    script = Script(rng, ends_at)
    script.add("started")
    _body(script, kind, rng.randint(3, 7))
    scenario = Scenario(run_id, customer, kind, tuple(script.calls))
    return scenario.shifted(ends_at - scenario.ended_at)
