"""A run's JSON shape is defined once: the API's wire type has exactly its fields."""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec

from api.wire import DecisionReply, RunReply
from metering.runs import DecisionView, RunView, run_document

AT = datetime(2026, 12, 1, tzinfo=UTC)


def test_the_run_document_and_the_wire_type_name_the_same_fields() -> None:
    decision = DecisionView(
        1, "policy", "billed", "Completed", 10, 10, 0, ["R0"], ["e1"], "x", "2026-12", AT
    )
    view = RunView(
        7,
        "r1",
        "c1",
        "Completed",
        "billed",
        10,
        10,
        0,
        0,
        0,
        ["R0"],
        "x",
        [decision],
        2,
        {"run.usage": 1},
        AT,
        AT,
        AT,
        AT,
        1,
        True,
        False,
        False,
    )
    document = run_document(view)
    assert set(document) == set(RunReply.__struct_fields__)
    assert set(document["decisions"][0]) == set(DecisionReply.__struct_fields__)
    reply = msgspec.convert(document, RunReply)
    assert msgspec.json.decode(msgspec.json.encode(reply)) == msgspec.json.decode(
        msgspec.json.encode(document)
    )
