"""Event destinations: each with its own secret and payload style, fed from an outbox.

Stripe signs every delivery with the destination's own secret (``Stripe-Signature``), sends
snapshot destinations the whole v1 ``event`` and thin destinations a v2 notification without
``data`` (fetched later from ``/v2/core/events/{id}``). The emulator queues generated events in
``Book.outbox`` and delivers them outside any Stripe API request: at the end of a control call
(``auto_deliver``) or on ``POST /_emulator/deliveries/flush``.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from devtools.stripe_emulator import webhooks
from devtools.stripe_emulator.billing_objects import Destination
from devtools.stripe_emulator.state import EmulatorState, new_id

STYLES = frozenset({"snapshot", "thin"})
# One flush at a time keeps deliveries in the order the events were made.
_FLUSH_LOCK = threading.Lock()


def add_destination(state: EmulatorState, spec: dict[str, Any]) -> dict[str, Any]:
    """Register a destination from ``{"url", "secret", "style", "name"?, "types"?,
    "api_version"?}``; a snapshot destination's events carry its ``api_version`` ("Handle
    webhook versioning": an endpoint has its own version or the account's default)."""
    url, secret, style = spec.get("url"), spec.get("secret"), spec.get("style")
    if not isinstance(url, str) or not isinstance(secret, str) or not url or not secret:
        raise ValueError("a destination needs 'url' and 'secret' (strings)")
    if style not in STYLES:
        raise ValueError(f"'style' must be one of {sorted(STYLES)}")
    types = spec.get("types")
    if types is not None and not (
        isinstance(types, list) and all(isinstance(t, str) for t in types)
    ):
        raise ValueError("'types' must be a list of event types")
    version = spec.get("api_version")
    if version is not None and not isinstance(version, str):
        raise ValueError("'api_version' must be a string")
    destination = Destination(new_id("we"), url, secret, style, spec.get("name"), types, version)
    with state.lock:
        state.book.destinations.append(destination)
    return destination.describe()


def enqueue(state: EmulatorState, style: str, event: dict[str, Any]) -> None:
    """Queue ``event`` for every destination of ``style`` (call with the state lock held)."""
    state.book.outbox.append((style, event))


def flush(state: EmulatorState) -> list[dict[str, Any]]:
    """Deliver every queued event to each destination that wants it; returns the outcomes."""
    outcomes: list[dict[str, Any]] = []
    with _FLUSH_LOCK:
        while True:
            with state.lock:
                if not state.book.outbox:
                    return outcomes
                style, event = state.book.outbox.pop(0)
                targets = [d for d in state.book.destinations if d.wants(style, event["type"])]
            for destination in targets:
                outcomes.append(_deliver(state, destination, event))


def _deliver(
    state: EmulatorState, destination: Destination, event: dict[str, Any]
) -> dict[str, Any]:
    if destination.style == "snapshot" and destination.api_version is not None:
        # Only the stamp changes: the emulator renders objects in its one API version.
        event = {**event, "api_version": destination.api_version}
    payload = json.dumps(event, separators=(",", ":"))
    header = webhooks.signature_header(payload, destination.secret)
    outcome: dict[str, Any] = {
        "event": event["id"],
        "type": event["type"],
        "url": destination.url,
        "destination": destination.id,
        "style": destination.style,
    }
    outcome.update(webhooks.post_signed(destination.url, payload, header))
    with state.lock:
        state.book.event_deliveries.append(outcome)
    return outcome
