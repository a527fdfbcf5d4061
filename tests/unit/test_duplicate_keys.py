"""The cheap duplicate-key count never misses a repeated key (api/cloudevents_http.py)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from api.cloudevents_http import _first_duplicate_key, _may_hold_duplicate_keys, decode_json
from metering.errors import MeteringError

# Keys and strings rich in ':' and in characters JSON may escape, so that a string's
# colons and a missing key's colon can be mistaken for each other if the count were wrong.
text = st.text(alphabet=st.sampled_from(["a", "b", ":", '"', "\\", "é", "\n", " "]), max_size=4)
scalars = st.none() | st.booleans() | st.integers() | text


@st.composite
def documents(draw: Any, depth: int = 3) -> str:
    """A JSON document written by hand: objects may repeat keys, strings may escape ':'."""
    kind = draw(st.sampled_from(["scalar", "array", "object"] if depth else ["scalar"]))
    if kind == "scalar":
        return _literal(draw, draw(scalars))
    if kind == "array":
        items = draw(st.lists(documents(depth - 1), max_size=3))
        return "[" + ",".join(items) + "]"
    keys = draw(st.lists(text, max_size=4))
    members = [f"{_literal(draw, k)} : {draw(documents(depth - 1))}" for k in keys]
    return "{" + ",".join(members) + "}"


def _literal(draw: Any, value: Any) -> str:
    written = json.dumps(value, ensure_ascii=draw(st.booleans()))
    if isinstance(value, str) and draw(st.booleans()):
        written = written.replace(":", "\\u003a")
    return written


@given(documents())
def test_the_count_says_maybe_whenever_the_exact_check_finds_a_repeated_key(document):
    body = document.encode()
    value = json.loads(body)
    if _first_duplicate_key(body) is not None:
        assert _may_hold_duplicate_keys(body, value)
    elif b"\\u003" not in body:  # no escaped colon: the count alone proves there is none
        assert not _may_hold_duplicate_keys(body, value)


@given(documents())
def test_decoding_refuses_exactly_the_documents_that_repeat_a_key(document):
    body = document.encode()
    repeated = _first_duplicate_key(body)
    try:
        decoded = decode_json(body)
    except MeteringError as exc:
        assert exc.code == "duplicate_key" and repeated is not None
    else:
        assert repeated is None and decoded == json.loads(body)
