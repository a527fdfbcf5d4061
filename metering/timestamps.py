"""Pure: RFC 3339 timestamps as the event catalogue reads and writes them.

Ingest parses event times, the price catalogue its ``effective_from``: one grammar for both,
kept here so neither package has to import the other.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

RFC3339 = re.compile(
    r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?(?:[Zz]|[+-]\d{2}:\d{2})$"
)


def parse_rfc3339(value: str) -> datetime | None:
    if not RFC3339.match(value):
        return None
    text = value.replace("z", "Z").replace("Z", "+00:00").replace("t", "T").replace(" ", "T")
    match = re.match(r"^(.*\.)(\d+)(.*)$", text)
    if match and len(match.group(2)) > 6:  # Python keeps microseconds; drop the rest
        text = match.group(1) + match.group(2)[:6] + match.group(3)
    try:
        return datetime.fromisoformat(text).astimezone(UTC)
    except (ValueError, OverflowError):  # 0001-01-01T00:00+01:00 is in the year 0 in UTC
        return None


def canonical_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
