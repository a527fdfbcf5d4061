"""The record of a decision's facts: a faithful round trip, or none at all."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from metering.policy.facts import EventFact, RunFacts, UsageLine
from metering.settlement.decided_facts import (
    DecidedFacts,
    decode_decided_facts,
    encode_decided_facts,
)

AT = datetime(2026, 11, 3, 9, 0, tzinfo=UTC)


def facts(data: dict[str, object] | None = None) -> RunFacts:
    events = (
        EventFact("gw/e1", "run.started", AT, {"customer": "c"}),
        EventFact("gw/e2", "run.usage", AT, {"model": "m"}),
        EventFact("gw/e3", "run.tool_call", AT, data or {"tool_call_id": "t", "n": 1.5}),
    )
    usage = (UsageLine(7, "gw/e2", 1, 2, "t", True, 1_234, AT + timedelta(seconds=1)),)
    return RunFacts(events, usage, abandoned=False)


def test_the_record_gives_back_the_facts_and_pricing_without_usage_events():
    record = encode_decided_facts(facts(), (("m", 10, 2, 3),))
    decided = decode_decided_facts(record)
    assert decided is not None
    assert decided.events == tuple(e for e in facts().events if e.type != "run.usage")
    assert decided.usage == facts().usage
    assert decided.pricing == (("m", 10, 2, 3),)
    # UTC as the policy's fast path recognises it (``tzinfo is UTC``), not an equal zone.
    assert all(e.time.tzinfo is UTC for e in decided.events)
    assert decided.usage[0].time.tzinfo is UTC


def test_event_data_messagepack_cannot_carry_keeps_no_record():
    assert encode_decided_facts(facts({"tool_call_id": "t", "n": 2**70}), (("m", 1, 0, 1),)) is None


def test_pricing_must_match_the_usage_lines_one_to_one():
    with pytest.raises(ValueError, match="one pricing entry per usage line"):
        encode_decided_facts(facts(), ())


@pytest.mark.parametrize(
    "record",
    [
        None,
        msgspec.msgpack.encode(DecidedFacts(2, (), (), ())),  # a later format
        msgspec.msgpack.encode([3, "not", "this"]),  # another shape
    ],
)
def test_no_record_or_one_of_another_format_reads_as_none(record):
    assert decode_decided_facts(record) is None
