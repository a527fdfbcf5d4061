"""The content hash must never drift: a retried event has to hash as it did when stored.

Stored hashes were made from ``json.dumps(sort_keys=True, separators=(",", ":"),
ensure_ascii=False)``; the hash is now computed with msgspec for speed. These tests hold
the two to the same bytes over every value validation lets through, and pin one hash made
by the old code.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from metering.ingest.validation import TimeWindow, ValidEvent, content_hash, validate_event

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
WINDOW = TimeWindow(now=NOW, max_future=timedelta(minutes=5), max_age=timedelta(days=35))


def reference_hash(attributes: Any, data: Any) -> bytes:
    canonical = json.dumps(
        {"attributes": attributes, "data": data},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(canonical.encode()).digest()


# What validation admits, and more: any text (control characters, astral planes, quotes,
# backslashes), integers beyond 64 bits, booleans, null, and nesting.
scalars = st.text() | st.integers() | st.booleans() | st.none()
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
objects = st.dictionaries(st.text(), values, max_size=6)


@given(attributes=objects, data=objects)
def test_the_hash_is_the_one_json_dumps_gave(attributes, data):
    assert content_hash(attributes, data) == reference_hash(attributes, data)


def test_a_hash_stored_by_the_json_implementation_is_reproduced():
    event = validate_event(
        {
            "specversion": "1.0",
            "id": "évt-1",
            "source": "agent/eu-1",
            "type": "run.usage",
            "subject": "run-1",
            "time": "2026-11-30T11:59:00.5+01:00",
            "traceparent": "00-ab",
            "retries": 3,
            "sampled": True,
            "data": {
                "customer": "cust-1",
                "model": "agent-large-1",
                "step": 2,
                "input_tokens": 1000,
                "output_tokens": 7,
                "tool_call_id": "t\u0001\u007f",
                "replay": False,
            },
        },
        "$",
        0,
        WINDOW,
    )
    assert isinstance(event, ValidEvent)
    # Computed by the json.dumps implementation (commit 9ea74f6; ``reference_hash`` here)
    # from this same event. Its run and customer ids were exotic text until ids got a
    # grammar (metering/ids.py); the other fields still carry non-ASCII and control text.
    assert event.body_hash.hex() == (
        "a94d6d4d2963346dfce877675889ac422117ab168a2dff51054bfae5a2df0b70"
    )


def test_floats_never_reach_the_hash():
    """msgspec and json write some floats differently (1e16): validation refuses them."""
    base = {
        "specversion": "1.0",
        "id": "e1",
        "source": "s",
        "type": "run.usage",
        "subject": "r1",
        "time": "2026-11-30T11:59:00Z",
    }
    usage = {"customer": "c", "model": "m", "step": 1, "input_tokens": 1, "output_tokens": 1}
    as_extension = validate_event({**base, "ratio": 1e16, "data": usage}, "$", 0, WINDOW)
    as_tokens = validate_event({**base, "data": {**usage, "input_tokens": 1e16}}, "$", 0, WINDOW)
    assert [(e.path, e.code) for e in as_extension] == [("$.ratio", "invalid_type")]
    assert [(e.path, e.code) for e in as_tokens] == [("$.data.input_tokens", "invalid_type")]
