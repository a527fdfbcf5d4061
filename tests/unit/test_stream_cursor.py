"""A live stream sends each notification once, whatever order and how often it is offered,
and the id a client resumes from never goes back (metering/notifications/cursor.py); the
ids and resume positions a stream accepts (metering/streams.py, metering/ids.py)."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metering.errors import MeteringError
from metering.ids import IdKind, lookup_problem
from metering.notifications.cursor import StreamCursor
from metering.notifications.replay import StoredNotification
from metering.streams import resume_position

AT = datetime(2026, 12, 1, tzinfo=UTC)


def note(nid: int) -> StoredNotification:
    return StoredNotification(nid, "acme", "c1", 1, "r1", "run.status_changed", {}, AT)


def sent_ids(cursor: StreamCursor, batches: list[list[int]]) -> list[tuple[int, bool]]:
    return [(n.id, adv) for batch in batches for n, adv in cursor.take(note(i) for i in batch)]


@given(
    start=st.integers(0, 50),
    ids=st.sets(st.integers(1, 400), max_size=80),
    repeats=st.integers(1, 3),
    seed=st.integers(0, 2**32 - 1),
    batch=st.integers(1, 7),
)
def test_every_id_but_the_start_is_sent_once_however_often_and_in_whatever_order_offered(
    start, ids, repeats, seed, batch
):
    """The fan-out and the table may both offer a row, in any order, many times; below the
    start come only notifications that committed late (the table is read after the start)."""
    rng = random.Random(seed)
    offered = [i for i in ids for _ in range(repeats)]
    rng.shuffle(offered)
    batches = [offered[k : k + batch] for k in range(0, len(offered), batch)]
    cursor = StreamCursor(start, window=1000)
    sent = sent_ids(cursor, batches)
    assert sorted(i for i, _ in sent) == sorted(ids - {start})
    advancing = [i for i, adv in sent if adv]
    assert advancing == sorted(set(advancing)), "the resume id only ever goes up"
    assert all(i > start for i in advancing)
    assert cursor.last_id == max([start, *ids])


def test_a_notification_committed_after_a_higher_one_is_sent_without_moving_the_resume_id():
    cursor = StreamCursor(10)
    assert sent_ids(cursor, [[12], [11], [12, 11, 13], [9, 10]]) == [
        (12, True),
        (11, False),
        (13, True),
        (9, False),  # committed late, after the stream started from 10
    ]
    assert cursor.last_id == 13


def test_ids_older_than_the_window_count_as_sent_and_catch_ups_read_after_them():
    cursor = StreamCursor(3, window=3)
    assert cursor.horizon == 3
    sent_ids(cursor, [[5, 6, 7, 8]])
    assert cursor.horizon == 5  # 5 was forgotten: everything at or below it counts as sent
    assert sent_ids(cursor, [[4, 5, 6, 9]]) == [(9, True)]


@pytest.mark.parametrize(
    ("header", "query", "resume"),
    [(None, None, None), ("", None, None), ("42", None, 42), (None, "7", 7), ("3", "9", 3)],
)
def test_the_header_wins_over_the_query_parameter(header, query, resume):
    assert resume_position(header, query) == resume


@pytest.mark.parametrize("bad", ["abc", "-1", "1.5", "١٢", "9" * 19, "0x10"])
def test_a_resume_id_that_no_stream_sent_is_a_422_naming_the_field(bad):
    with pytest.raises(MeteringError) as refused:
        resume_position(bad, None)
    assert refused.value.status == 422
    assert [e.path for e in refused.value.errors] == ["$.last_event_id"]


def test_stream_ids_refused_are_only_those_no_column_could_hold():
    assert lookup_problem("org-7/run-1", IdKind.RUN) is None  # stored before the grammar
    assert lookup_problem("r" * 200, IdKind.RUN) is None
    assert lookup_problem("r" * 201, IdKind.RUN) is not None
    assert lookup_problem("c" * 129, IdKind.CUSTOMER) is not None
    assert lookup_problem("a\x00b", IdKind.RUN) is not None
    assert lookup_problem("a\ud800", IdKind.RUN) is not None
