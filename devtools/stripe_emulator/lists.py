"""Stripe list objects and cursor pagination (``limit``, ``starting_after``, ``ending_before``)."""

from __future__ import annotations

from typing import Any

from devtools.stripe_emulator.errors import invalid_request
from devtools.stripe_emulator.forms import Params
from devtools.stripe_emulator.params import optional_int, optional_str

DEFAULT_LIMIT = 10
MAX_LIMIT = 100


def paginate(items: list[dict[str, Any]], params: Params, url: str) -> dict[str, Any]:
    """One page of ``items`` (already in Stripe's order, each with an ``id``)."""
    limit = optional_int(params, "limit")
    limit = DEFAULT_LIMIT if limit is None else limit
    if not 1 <= limit <= MAX_LIMIT:
        raise invalid_request(f"Invalid limit: must be between 1 and {MAX_LIMIT}", param="limit")
    after = optional_str(params, "starting_after")
    before = optional_str(params, "ending_before")
    ids = [item["id"] for item in items]
    if after is not None:
        start = _position(ids, after, "starting_after") + 1
        page = items[start : start + limit]
        has_more = start + limit < len(items)
    elif before is not None:
        end = _position(ids, before, "ending_before")
        page = items[max(0, end - limit) : end]
        has_more = end - limit > 0
    else:
        page = items[:limit]
        has_more = limit < len(items)
    return {"object": "list", "data": page, "has_more": has_more, "url": url}


def _position(ids: list[str], cursor: str, param: str) -> int:
    try:
        return ids.index(cursor)
    except ValueError:
        raise invalid_request(
            f"Invalid {param}: no object with id '{cursor}' in this list", param=param
        ) from None
