"""Pure parts of delivery: how replies are sorted, Retry-After, the backoff's bounds."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx
import pytest
from fairmeter_client.transport import Backoff, Verdict, classify, retry_after_s


@pytest.mark.parametrize(
    ("status", "verdict"),
    [
        (200, Verdict.DELIVERED),
        (429, Verdict.RETRY),
        (500, Verdict.RETRY),
        (503, Verdict.RETRY),
        (413, Verdict.SPLIT),
        (422, Verdict.REJECTED),
        (409, Verdict.REJECTED),
        (400, Verdict.REJECTED),
        (401, Verdict.CONFIGURATION),
        (403, Verdict.CONFIGURATION),
        (404, Verdict.CONFIGURATION),
        (307, Verdict.CONFIGURATION),
    ],
)
def test_replies_are_sorted_by_what_the_client_must_do(status, verdict):
    assert classify(httpx.Response(status, json={"code": "x"})).verdict is verdict


def test_problem_details_and_retry_after_are_kept():
    reply = classify(
        httpx.Response(
            503, headers={"Retry-After": "7"}, json={"code": "database_unavailable", "detail": "d"}
        )
    )
    assert (reply.code, reply.detail, reply.retry_after_s) == ("database_unavailable", "d", 7.0)
    assert classify(httpx.Response(502, text="<html>bad gateway</html>")).code == "http_502"


def test_retry_after_reads_seconds_and_http_dates():
    later = datetime.now(UTC) + timedelta(seconds=120)
    assert retry_after_s("30") == 30.0
    assert 100 < (retry_after_s(format_datetime(later, usegmt=True)) or 0) <= 120
    assert retry_after_s("soon") is None
    assert retry_after_s(None) is None
    assert retry_after_s("999999") == 600.0


def test_backoff_grows_with_jitter_up_to_its_cap_and_never_undercuts_retry_after():
    backoff = Backoff(0.5, 8.0, random.Random(1))
    delays = [backoff.next_delay() for _ in range(10)]
    assert 0.25 <= delays[0] <= 0.5
    assert all(4.0 <= d <= 8.0 for d in delays[5:])
    assert backoff.next_delay(retry_after=20.0) == 20.0
    backoff.reset()
    assert backoff.next_delay() <= 0.5
