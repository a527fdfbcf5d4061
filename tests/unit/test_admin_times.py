"""The one parser of admin bodies' time fields (``effective_from``, ``since``)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from api.admin import rfc3339
from metering.errors import MeteringError


def test_a_time_with_its_zone_is_read_as_that_moment():
    assert rfc3339("2026-12-10T00:00:00Z", "$.since") == datetime(2026, 12, 10, tzinfo=UTC)


@pytest.mark.parametrize("text", ["2026-12-10T00:00:00", "yesterday", ""])
def test_a_time_without_a_zone_or_not_a_time_is_422_naming_the_callers_field(text):
    with pytest.raises(MeteringError) as raised:
        rfc3339(text, "$.effective_from")
    assert raised.value.status == 422
    assert [(e.path, e.code) for e in raised.value.errors] == [("$.effective_from", "invalid_time")]
