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
from metering.notifications.cursor import (
    TOKEN_IDS,
    InvalidToken,
    StreamCursor,
    format_token,
    parse_token,
)
from metering.notifications.replay import StoredNotification
from metering.streams import resume_position

AT = datetime(2026, 12, 1, tzinfo=UTC)


def note(nid: int) -> StoredNotification:
    return StoredNotification(nid, "acme", "c1", 1, "r1", "run.status_changed", {}, AT)


def sent_ids(cursor: StreamCursor, batches: list[list[int]]) -> list[tuple[int, bool]]:
    """Each id sent, with whether it moved the highest id sent (a late one does not)."""
    sent = []
    for batch in batches:
        for n, _ in cursor.take(note(i) for i in batch):
            sent.append((n.id, n.id == cursor.last_id))
    return sent


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


def test_a_notification_committed_after_a_higher_one_is_sent_without_moving_the_highest_id():
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
    found = resume_position(header, query)
    assert (found.floor if found else None) == resume


def test_a_token_lists_what_was_sent_above_its_floor_with_consecutive_ids_as_one_item():
    assert format_token(10, [12, 13, 14, 20]) == "10.2-2.6"
    assert parse_token("10.2-2.6") == (10, [12, 13, 14, 20])
    assert parse_token("42") == (42, [])


@given(
    start=st.integers(0, 10**6),
    ids=st.lists(st.integers(1, 10**6), max_size=120),
)
def test_a_token_read_back_is_the_cursor_it_was_made_from(start, ids):
    cursor = StreamCursor(start)
    tokens = [token for _, token in cursor.take(note(i) for i in ids)]
    for token in tokens:
        floor, sent = parse_token(token)
        assert format_token(floor, sent) == token
        assert len(sent) <= TOKEN_IDS and all(i > floor for i in sent)
    if tokens:
        floor, sent = parse_token(tokens[-1])
        # Everything the cursor sent is at or below the floor or listed: none sent twice.
        assert {i for i in set(ids) - {start} if i > floor} <= set(sent)


def test_a_late_notification_that_commits_while_the_client_is_away_is_sent_on_resume_once():
    """The gap a plain highest-id resume had: 11 is in flight while 12 is sent; the client
    drops; 11 commits; the resumed stream reads the table after the token's floor."""
    first = StreamCursor(10)
    [(_, token)] = first.take([note(12)])
    resumed = StreamCursor.resumed(token)
    assert resumed.horizon <= 10  # the catch-up reads after the floor: 11 and 12 come back
    assert [n.id for n, _ in resumed.take([note(11), note(12), note(13)])] == [11, 13]


@given(
    seed=st.integers(0, 2**32 - 1),
    count=st.integers(1, 60),
    drop_after=st.integers(0, 60),
)
def test_whatever_order_ids_commit_in_a_resumed_stream_sends_each_once(seed, count, drop_after):
    """Ids commit in a shuffled order (within a few places of their numbering, as concurrent
    transactions do); the client drops after some events and resumes with the last token,
    the resumed stream reads the table (all committed so far) and then what commits next."""
    rng = random.Random(seed)
    order = list(range(101, 101 + count))
    for k in range(len(order) - 1):  # local swaps: a few in flight at once
        if rng.random() < 0.4:
            order[k], order[k + 1] = order[k + 1], order[k]
    cut = min(drop_after, count)
    first = StreamCursor(100)
    got = [(n.id, token) for n, token in first.take(note(i) for i in order[:cut])]
    token = got[-1][1] if got else "100"
    late_meanwhile = order[cut : cut + 2]  # commit while the client is away
    committed = set(order[:cut]) | set(late_meanwhile)
    resumed = StreamCursor.resumed(token)
    table = [note(i) for i in sorted(committed) if i > resumed.horizon]
    again = [n.id for n, _ in resumed.take(table)]
    again += [n.id for n, _ in resumed.take(note(i) for i in order[cut + 2 :])]
    assert sorted([i for i, _ in got] + again) == sorted(order)


@pytest.mark.parametrize(
    "bad", ["10.0", "10.zzzzzzzzzzzzz", "10..1", "10.1-", "1" + ".1" * (TOKEN_IDS + 1), "x.1"]
)
def test_a_token_this_server_could_not_have_made_is_refused(bad):
    with pytest.raises(InvalidToken):
        parse_token(bad)


@pytest.mark.parametrize("bad", ["abc", "-1", "1.5_", "١٢", "9" * 19, "0x10", "1" * 2000])
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
