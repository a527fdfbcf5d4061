"""The fan-out cursor: ids passed over while their transaction was open are looked for again
until the horizon; no id that commits within it is ever skipped."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from metering.webhooks.fanout import Cursor, advance

HORIZON = 600.0


def test_contiguous_ids_leave_no_gap() -> None:
    moved = advance(Cursor(0), [1, 2, 3], set(), 100.0, HORIZON)
    assert moved == Cursor(3, {})


def test_a_missing_id_is_a_gap_until_it_turns_up() -> None:
    moved = advance(Cursor(0), [1, 3, 6], set(), 100.0, HORIZON)
    assert moved == Cursor(6, {2: 100.0, 4: 100.0, 5: 100.0})
    later = advance(moved, [7], {4}, 150.0, HORIZON)
    assert later == Cursor(7, {2: 100.0, 5: 100.0})


def test_a_gap_is_given_up_at_the_horizon_a_rolled_back_transaction() -> None:
    moved = advance(Cursor(0), [1, 3], set(), 100.0, HORIZON)
    assert advance(moved, [], set(), 100.0 + HORIZON - 1, HORIZON).gaps == {2: 100.0}
    assert advance(moved, [], set(), 100.0 + HORIZON, HORIZON).gaps == {}


def test_nothing_new_keeps_the_cursor() -> None:
    assert advance(Cursor(9, {4: 1.0}), [], set(), 2.0, HORIZON) == Cursor(9, {4: 1.0})


@given(
    commits=st.permutations(list(range(1, 40))),
    batch=st.integers(1, 10),
    rolled_back=st.sets(st.integers(1, 39), max_size=8),
)
def test_every_committed_id_is_read_exactly_when_it_commits_whatever_the_order(
    commits: list[int], batch: int, rolled_back: set[int]
) -> None:
    """Transactions commit in any order (ids 1..39 allocated in order); the fan-out runs
    between commits, reading past the cursor ``batch`` at a time plus the gaps it tracks."""
    visible: set[int] = set()
    read: list[int] = []
    cursor = Cursor(0)
    clock = 0.0

    def fan_out() -> None:
        nonlocal cursor
        new = sorted(i for i in visible if i > cursor.fanned_out_to)[:batch]
        late = {i for i in cursor.gaps if i in visible}
        read.extend([*late, *new])
        cursor = advance(cursor, new, late, clock, HORIZON)

    for i in commits:
        clock += 1.0  # every transaction commits within the horizon
        if i not in rolled_back:
            visible.add(i)
        fan_out()
    for _ in range(40):
        fan_out()
    assert sorted(read) == sorted(visible)  # each once, none missed
    assert cursor.fanned_out_to == max(visible, default=0)
