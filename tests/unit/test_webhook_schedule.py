"""The retry schedule, giving up after its last wait, and disabling an endpoint that has
failed for three days."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from freezegun import freeze_time
from hypothesis import given
from hypothesis import strategies as st

from metering.config import Settings
from metering.webhooks.schedule import (
    JITTER,
    GiveUp,
    Retry,
    after_failure,
    disabled_reason,
    should_disable,
)

SCHEDULE = Settings().webhooks_retry_schedule_s
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
THREE_DAYS = 3 * 24 * 3600


def middle() -> float:
    return 0.5


def test_the_default_schedule_is_5s_5min_30min_2h_5h_10h_10h() -> None:
    assert SCHEDULE == [5, 300, 1800, 7200, 18000, 36000, 36000]


def test_each_failure_waits_the_next_step_of_the_schedule() -> None:
    waits = []
    for tries in range(1, len(SCHEDULE) + 1):
        outcome = after_failure(tries, NOW, SCHEDULE, middle)
        assert isinstance(outcome, Retry)
        waits.append((outcome.at - NOW).total_seconds())
    assert waits == SCHEDULE


def test_the_failure_after_the_last_wait_gives_up_eight_attempts_in_all() -> None:
    assert isinstance(after_failure(len(SCHEDULE), NOW, SCHEDULE, middle), Retry)
    assert isinstance(after_failure(len(SCHEDULE) + 1, NOW, SCHEDULE, middle), GiveUp)


def test_the_whole_schedule_spans_about_a_day() -> None:
    moment = NOW
    with freeze_time(NOW) as clock:
        tries = 1
        while isinstance(outcome := after_failure(tries, moment, SCHEDULE, middle), Retry):
            clock.move_to(outcome.at)
            moment = outcome.at
            tries += 1
    assert tries == 8
    assert timedelta(hours=27) < moment - NOW < timedelta(hours=29)


@given(tries=st.integers(1, len(SCHEDULE)), draw=st.floats(0, 1, exclude_max=True))
def test_jitter_stays_within_a_fifth_of_the_wait(tries: int, draw: float) -> None:
    outcome = after_failure(tries, NOW, SCHEDULE, lambda: draw)
    assert isinstance(outcome, Retry)
    wait = (outcome.at - NOW).total_seconds()
    step = SCHEDULE[tries - 1]
    assert step * (1 - JITTER) - 1e-6 <= wait <= step * (1 + JITTER) + 1e-6


def test_jitter_spreads_messages_that_failed_together() -> None:
    draws = iter([0.0, 0.25, 0.5, 0.75, 0.99])
    moments = {after_failure(2, NOW, SCHEDULE, lambda: next(draws)).at for _ in range(5)}  # type: ignore[union-attr]
    assert len(moments) == 5


def test_an_endpoint_failing_for_three_days_is_disabled_with_a_reason() -> None:
    since = NOW
    with freeze_time(NOW) as clock:
        clock.tick(timedelta(days=3) - timedelta(seconds=1))
        assert not should_disable(since, datetime.now(UTC), THREE_DAYS)
        clock.tick(timedelta(seconds=1))
        assert should_disable(since, datetime.now(UTC), THREE_DAYS)
        reason = disabled_reason(since, datetime.now(UTC))
    assert "3 days" in reason and since.isoformat() in reason and "enable" in reason


def test_an_endpoint_that_is_not_failing_is_never_disabled() -> None:
    assert not should_disable(None, NOW + timedelta(days=365), THREE_DAYS)
