"""Pure: which ledger entries move a run from its current position to a decision's.

A run's *position* is what has been posted as billed and released as credited. The first
time money moves it moves by ``post`` and ``release`` (both non-negative, like a two-phase
transfer's post and void); every later change is a signed ``correction`` naming the side it
corrects. Nothing is ever edited.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Position:
    billed_micros: int = 0
    credited_micros: int = 0

    @property
    def is_empty(self) -> bool:
        return self.billed_micros == 0 and self.credited_micros == 0


@dataclass(frozen=True, slots=True)
class Posting:
    kind: str  # "post" | "release" | "correction"
    amount_micros: int
    corrects: str | None = None  # "billed" | "credited" for corrections


def postings_between(current: Position, target: Position) -> list[Posting]:
    """The entries that take ``current`` to ``target`` (none when they are equal)."""
    if current.is_empty:
        entries = [
            Posting("post", target.billed_micros),
            Posting("release", target.credited_micros),
        ]
        return [e for e in entries if e.amount_micros]
    billed_delta = target.billed_micros - current.billed_micros
    credited_delta = target.credited_micros - current.credited_micros
    entries = [
        Posting("correction", billed_delta, "billed"),
        Posting("correction", credited_delta, "credited"),
    ]
    return [e for e in entries if e.amount_micros]


def apply(current: Position, postings: list[Posting]) -> Position:
    """The position after ``postings`` — the inverse check of :func:`postings_between`."""
    billed, credited = current.billed_micros, current.credited_micros
    for posting in postings:
        if posting.kind == "post" or posting.corrects == "billed":
            billed += posting.amount_micros
        else:
            credited += posting.amount_micros
    return Position(billed, credited)
