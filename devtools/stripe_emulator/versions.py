"""API versions: the ``Stripe-Version`` header, else the account's default, picks the shapes.

"Stripe selects the API version for each request from the request's Stripe-Version header
(if set) … [or] the account's default API version" ("How API versioning works",
https://docs.stripe.com/api-versions). The emulator renders in its own version and reshapes
what differs across the versions it knows; today one field: an invoice line names its price
in ``pricing.price_details.price`` from 2025-03-31.basil on, and in a top-level ``price``
object before ("Basil" changelog, https://docs.stripe.com/changelog/basil).

Versions are named ``YYYY-MM-DD`` up to 2024-06-20 and ``YYYY-MM-DD.<release>`` since
2024-09-30.acacia, a release spanning months; anything else is refused with a 400.
"""

from __future__ import annotations

import re
from datetime import date
from typing import Any

from devtools.stripe_emulator.errors import invalid_request
from devtools.stripe_emulator.prices import render_price
from devtools.stripe_emulator.state import EmulatorState

BASIL = "2025-03-31"
LAST_UNNAMED = "2024-06-20"
# Each release's first version date, oldest first (the changelog's release names).
RELEASES = {
    "acacia": "2024-09-30",
    "basil": BASIL,
    "clover": "2025-09-30",
    "dahlia": "2026-03-25",
    "endive": "2026-09-30",
}
_FORM = re.compile(r"(\d{4}-\d{2}-\d{2})(?:\.([a-z]+))?")


def requested(header: str | None, default: str) -> str:
    """The version a request is served in, or Stripe's 400 for one it does not know."""
    if header is None or header == "":
        return default
    if not is_known(header):
        raise invalid_request(
            f"Invalid Stripe API version: {header}. Please see "
            "https://docs.stripe.com/upgrades for valid API versions.",
        )
    return header


def is_known(version: str) -> bool:
    found = _FORM.fullmatch(version)
    if found is None or not _is_date(found.group(1)):
        return False
    day, release = found.groups()
    if release is None:
        return day <= LAST_UNNAMED
    if release not in RELEASES:
        return False
    starts = sorted(RELEASES.values())
    start = RELEASES[release]
    later = [other for other in starts if other > start]
    return start <= day and (not later or day < later[0])


def reshape(body: Any, version: str, state: EmulatorState) -> Any:
    """``body`` (rendered in the newest shapes) as ``version`` shows it (lock not held)."""
    if version[:10] >= BASIL:
        return body
    with state.lock:
        return _before_basil(body, state)


def _before_basil(node: Any, state: EmulatorState) -> Any:
    if isinstance(node, list):
        return [_before_basil(item, state) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _before_basil(value, state) for key, value in node.items()}
    if out.get("object") == "line_item" and isinstance(out.get("pricing"), dict):
        price_id = out.pop("pricing")["price_details"]["price"]
        price = state.book.prices.get(price_id)
        out["price"] = render_price(price) if price is not None else None
    return out


def _is_date(text: str) -> bool:
    try:
        date.fromisoformat(text)
    except ValueError:
        return False
    return True
