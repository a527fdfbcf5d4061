"""Which months the archive takes, and the digest that proves a file equals its partition
(metering/history/archive_plan.py): pure, no database."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal

import pytest
from freezegun import freeze_time
from hypothesis import given
from hypothesis import strategies as st

from metering.config import Settings
from metering.history.archive_plan import (
    Digest,
    Partition,
    PeriodError,
    due_partitions,
    kept_for_audit,
    month_of_bound,
    months_before,
    parse_period,
    past_retention,
    period_label,
)

SETTINGS = Settings(events_retention_months=13, history_retention_months=84)


def now() -> datetime:
    return datetime.now(UTC)


@freeze_time("2026-12-31 23:59:59.999999")
def test_on_the_last_instant_of_a_month_the_month_thirteen_back_still_stays():
    assert past_retention(date(2025, 10, 1), now(), 13)
    assert not past_retention(date(2025, 11, 1), now(), 13)


@freeze_time("2027-01-01 00:00:00")
def test_at_midnight_the_month_that_just_reached_its_retention_is_due():
    assert past_retention(date(2025, 11, 1), now(), 13)
    assert not past_retention(date(2025, 12, 1), now(), 13)


@freeze_time("2026-03-31 12:00:00")
def test_month_arithmetic_clamps_to_the_shorter_month():
    assert months_before(now(), 1) == datetime(2026, 2, 28, 12, tzinfo=UTC)
    assert months_before(now(), 13) == datetime(2025, 2, 28, 12, tzinfo=UTC)
    assert months_before(datetime(2024, 3, 31, tzinfo=UTC), 1) == datetime(2024, 2, 29, tzinfo=UTC)
    assert months_before(datetime(2026, 1, 15, tzinfo=UTC), 84) == datetime(2019, 1, 15, tzinfo=UTC)


def test_a_time_in_another_zone_is_judged_in_utc():
    # 1 December 2026 00:30 in UTC+2 is still 30 November in UTC.
    local = datetime(2026, 12, 1, 0, 30, tzinfo=timezone(timedelta(hours=2)))
    assert not past_retention(date(2025, 10, 1), local, 13)
    assert past_retention(date(2025, 10, 1), datetime(2026, 12, 1, 0, 30, tzinfo=UTC), 13)


@freeze_time("2026-12-02 12:00:00")
def test_events_leave_after_thirteen_months_and_the_rest_after_seven_years():
    parts = [
        Partition("events", "events_y2025m10", date(2025, 10, 1)),
        Partition("events", "events_y2025m11", date(2025, 11, 1)),
        Partition("ledger_entries", "ledger_entries_y2025m01", date(2025, 1, 1)),
        Partition("ledger_entries", "ledger_entries_y2019m10", date(2019, 10, 1)),
        Partition("audit_log", "audit_log_y2019m12", date(2019, 12, 1)),
        Partition("some_new_table", "some_new_table_y2024m01", date(2024, 1, 1)),
    ]
    due = due_partitions(parts, now(), SETTINGS)
    assert [p.name for p in due] == ["ledger_entries_y2019m10", "events_y2025m10"]


def test_only_a_partition_of_exactly_one_utc_month_has_a_month():
    bound = "FOR VALUES FROM ('2025-10-01 00:00:00+00') TO ('2025-11-01 00:00:00+00')"
    assert month_of_bound(bound) == date(2025, 10, 1)
    assert month_of_bound("DEFAULT") is None
    two = "FOR VALUES FROM ('2025-10-01 00:00:00+00') TO ('2025-12-01 00:00:00+00')"
    assert month_of_bound(two) is None
    shifted = "FOR VALUES FROM ('2025-10-01 00:00:00+02') TO ('2025-11-01 00:00:00+02')"
    assert month_of_bound(shifted) is None
    assert month_of_bound("FOR VALUES FROM (MINVALUE) TO ('2025-11-01 00:00:00+00')") is None


def test_periods_are_year_and_month():
    assert parse_period("2025-03") == date(2025, 3, 1)
    assert period_label(date(2025, 3, 1)) == "2025-03"
    for bad in ("2025-13", "2025-3", "March", "2025-03-01", ""):
        with pytest.raises(PeriodError):
            parse_period(bad)


def digest_of(rows):
    digest = Digest()
    digest.add(rows)
    return digest.rows, digest.hex


ROW = (
    1,
    "acme",
    None,
    True,
    b"\x00\xff",
    ["a", None, ""],
    [1, None],
    '{"a": 1}',
    datetime(2025, 10, 1, 0, 0, 0, 1, tzinfo=UTC),
    Decimal("1.50"),
    date(2025, 10, 1),
)


def test_the_digest_sees_every_column_and_kind():
    base = digest_of([ROW])
    changes = {
        2: "",  # NULL is not ''
        3: 1,  # true is not 1
        4: b"\x00\xfe",
        5: ["a", "", None],  # array order and NULL elements
        6: [1],
        7: '{"a": 2}',
        8: datetime(2025, 10, 1, 0, 0, 0, 2, tzinfo=UTC),  # one microsecond
        9: Decimal("1.5"),
    }
    for index, value in changes.items():
        changed = (*ROW[:index], value, *ROW[index + 1 :])
        assert digest_of([changed]) != base, index


def test_a_time_digests_the_same_in_any_zone():
    moment = datetime(2025, 10, 1, 2, tzinfo=timezone(timedelta(hours=2)))
    assert digest_of([(moment,)]) == digest_of([(moment.astimezone(UTC),)])


@given(st.lists(st.tuples(st.integers(), st.text() | st.none()), max_size=20), st.randoms())
def test_the_digest_ignores_order_but_counts_repeats(rows, random):
    shuffled = list(rows)
    random.shuffle(shuffled)
    assert digest_of(rows) == digest_of(shuffled)
    if rows:
        assert digest_of(rows + rows[:1]) != digest_of(rows)


def test_a_restored_month_is_kept_for_its_audit_then_may_leave():
    restored = datetime(2026, 12, 2, 9, tzinfo=UTC)
    keep = timedelta(days=30)
    assert kept_for_audit(restored, restored + timedelta(days=29), keep) == restored + keep
    assert kept_for_audit(restored, restored + keep, keep) is None
    assert kept_for_audit(None, restored, keep) is None
