"""Runs of each kind, as event lists, with the outcome docs/policy.md gives them."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from tests.helpers.events import event, usage

KINDS = {
    "completed": "confirmed",
    "server-drop": "refunded",
    "partial-delivery": "partially_credited",
    "client-claim": "held_for_review",
    "user-cancel": "confirmed",
}


def scenario(kind: str, run: str, customer: str, start: datetime) -> list[dict[str, Any]]:
    """Events of one run of ``kind``; ``KINDS[kind]`` is the outcome it must settle to."""

    def at(minutes: float) -> datetime:
        return start + timedelta(minutes=minutes)

    def e(type_: str, minute: float, **data: Any) -> dict[str, Any]:
        return event(type=type_, run=run, customer=customer, time=at(minute), **data)

    def u(step: int, minute: float, **data: Any) -> dict[str, Any]:
        return usage(
            run=run, customer=customer, step=step, time=at(minute), model="agent-small-1", **data
        )

    work = [e("run.started", 0, attempt=1), u(1, 1), u(2, 2)]
    if kind == "completed":
        return [*work, e("run.delivered", 2.5, step=2, kind="final"), e("run.completed", 3)]
    if kind == "server-drop":
        return [*work, e("connection.lost", 3, side="server"), e("run.failed", 4, cause="network")]
    if kind == "partial-delivery":
        return [
            *work,
            e("run.delivered", 1.5, step=1, kind="partial"),
            u(3, 3),
            e("run.failed", 4, cause="provider"),
        ]
    if kind == "client-claim":
        return [*work, e("connection.lost", 3, side="client"), e("run.failed", 4, cause="client")]
    if kind == "user-cancel":
        return [*work, e("run.cancelled", 3, by="user")]
    raise ValueError(kind)
