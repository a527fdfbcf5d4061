"""The facts a decision was made on, kept with it: one compact record per decision.

Settlement has every fact of a run in memory when it decides it (its events but usage, its
usage lines with their names, models and tokens). Kept on the decision (``decisions.facts``,
MessagePack), they let a what-if replay read one value per run instead of ~20 rows scattered
over the events and usage-line tables, and build the policy's facts in C instead of row by
row in Python (``metering/settlement/replay.py``). They are also what support can point at:
exactly what the policy saw, even if later evidence re-opened the run.

The record is a cache of facts defined elsewhere (events and usage lines stay the source of
truth). So it is versioned (``FORMAT``), and a decision without one (made before migration
0022, or one whose event data MessagePack cannot carry) is replayed from the tables as
before: a record is never required, only faster.
"""

from __future__ import annotations

from typing import Final

import msgspec

from metering.policy.facts import EventFact, RunFacts, UsageLine

FORMAT: Final = 1

# A usage line's pricing inputs (model, input, cached input and output tokens): what the
# provider-cost catalog prices, kept beside the line in the same order.
LinePricing = tuple[str, int, int, int]


class DecidedFacts(msgspec.Struct, frozen=True, array_like=True):
    """``format`` first, so a later shape can be told apart (and read from the tables)."""

    format: int
    events: tuple[EventFact, ...]  # every event of the run except ``run.usage``
    usage: tuple[UsageLine, ...]
    pricing: tuple[LinePricing, ...]  # of ``usage``, index by index


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(DecidedFacts)


def encode_decided_facts(facts: RunFacts, pricing: tuple[LinePricing, ...]) -> bytes | None:
    """The record of ``facts`` (``run.usage`` events left out: each is its usage line), or
    None when the run's event data holds a value MessagePack cannot carry (an integer
    beyond 64 bits): that decision is then replayed from the tables."""
    if len(pricing) != len(facts.usage):
        raise ValueError("one pricing entry per usage line")
    events = tuple(e for e in facts.events if e.type != "run.usage")
    try:
        return _encoder.encode(DecidedFacts(FORMAT, events, facts.usage, pricing))
    except OverflowError:
        return None


def decode_decided_facts(record: bytes | None) -> DecidedFacts | None:
    """The facts of a record, or None for no record or one of another format."""
    if record is None:
        return None
    try:
        decided = _decoder.decode(record)
    except msgspec.ValidationError:  # another format's shape
        return None
    return decided if decided.format == FORMAT else None
