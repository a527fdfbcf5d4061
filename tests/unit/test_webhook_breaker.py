"""The per-endpoint circuit breaker: a receiver failing in a row gets one probing send at a
time, then none for a pause that doubles up to its cap; one answer closes it; a 4xx (the
receiver answered) never trips it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from metering.webhooks.breaker import (
    HALF_OPEN_AFTER,
    OPEN_AFTER,
    Breaker,
    after_attempt,
    allowance,
    trips,
)

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
SHARE = 8


def failed(breaker: Breaker, at: datetime = NOW, *, cap_s: float = 5.0) -> Breaker:
    return after_attempt(breaker, tripped=True, now=at, pause_s=1.0, max_pause_s=cap_s)


def test_a_healthy_endpoint_has_its_whole_share() -> None:
    assert allowance(Breaker(), NOW, SHARE) == SHARE


def test_failures_in_a_row_leave_one_probing_send_then_none() -> None:
    breaker = Breaker()
    shares = []
    for _ in range(OPEN_AFTER):
        breaker = failed(breaker)
        shares.append(allowance(breaker, NOW, SHARE))
    assert shares[: HALF_OPEN_AFTER - 1] == [SHARE] * (HALF_OPEN_AFTER - 1)
    assert shares[HALF_OPEN_AFTER - 1 : OPEN_AFTER - 1] == [1] * (OPEN_AFTER - HALF_OPEN_AFTER)
    assert shares[-1] == 0  # open
    assert breaker.open_until is not None
    # Once the pause has passed: half-open, one probe.
    assert allowance(breaker, breaker.open_until, SHARE) == 1


def test_the_pause_doubles_with_each_failed_probe_up_to_its_cap() -> None:
    breaker = Breaker(failures=OPEN_AFTER - 1)
    pauses = []
    at = NOW
    for _ in range(6):
        breaker = failed(breaker, at)
        assert breaker.open_until is not None
        pauses.append((breaker.open_until - at).total_seconds())
        at = breaker.open_until  # the probe goes out when the pause ends, and fails
    assert pauses == [1, 2, 4, 5, 5, 5]


def test_one_answered_attempt_closes_it() -> None:
    breaker = failed(Breaker(failures=10))
    closed = after_attempt(breaker, tripped=False, now=NOW, pause_s=1.0, max_pause_s=5.0)
    assert closed == Breaker()
    assert allowance(closed, NOW, SHARE) == SHARE


def test_no_answer_a_5xx_or_a_429_trips_it_and_another_4xx_does_not() -> None:
    assert trips(None, "ReadTimeout")
    assert trips(None, "ConnectError: refused")
    assert trips(503, None) and trips(500, None) and trips(429, None)
    assert not trips(400, None) and not trips(410, None) and not trips(200, None)


@given(
    outcomes=st.lists(st.booleans(), max_size=40),
    cap_s=st.floats(min_value=0.5, max_value=600),
)
def test_the_allowance_never_exceeds_the_share_and_a_pause_never_exceeds_its_cap(
    outcomes: list[bool], cap_s: float
) -> None:
    breaker = Breaker()
    at = NOW
    for tripped in outcomes:
        breaker = after_attempt(breaker, tripped=tripped, now=at, pause_s=1.0, max_pause_s=cap_s)
        assert 0 <= allowance(breaker, at, SHARE) <= SHARE
        if breaker.open_until is not None:
            assert breaker.open_until - at <= timedelta(seconds=cap_s)
        if not tripped:
            assert allowance(breaker, at, SHARE) == SHARE
        at += timedelta(seconds=1)
