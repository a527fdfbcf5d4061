"""Stripe's v1 request encoding: ``application/x-www-form-urlencoded`` with bracketed keys.

``payload[value]=12`` becomes ``{"payload": {"value": "12"}}``; ``expand[]=a&expand[]=b`` and
``expand[0]=a&expand[1]=b`` both become ``{"expand": ["a", "b"]}``. Values stay strings, as
Stripe receives them; handlers coerce and validate.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qsl

from devtools.stripe_emulator.errors import invalid_request

Params = dict[str, Any]


def parse_form(body: str) -> Params:
    """Parse a form-encoded body or query string into nested dicts and lists."""
    root: dict[str, Any] = {}
    for key, value in parse_qsl(body, keep_blank_values=True):
        _insert(root, _split_key(key), value)
    return _listify(root)


def fingerprint(endpoint: str, params: Params) -> str:
    """A canonical text of a request, compared to detect idempotency-key reuse."""
    return f"{endpoint} {json.dumps(params, sort_keys=True, separators=(',', ':'))}"


def _split_key(key: str) -> list[str]:
    head, bracket, rest = key.partition("[")
    if not bracket:
        return [key]
    parts = [head]
    while rest:
        inner, closing, rest = rest.partition("]")
        if not closing:
            raise invalid_request(f"Invalid parameter name: {key}", param=key)
        parts.append(inner)
        rest = rest[1:] if rest.startswith("[") else rest
    return parts


def _insert(node: dict[str, Any], parts: list[str], value: str) -> None:
    for index, part in enumerate(parts):
        last = index == len(parts) - 1
        # "[]" appends: give the new element the next free numeric slot.
        key = str(_next_slot(node)) if part == "" else part
        if last:
            node[key] = value
            return
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise invalid_request(f"Invalid array or hash: {parts[0]}", param=parts[0])
        node = child


def _next_slot(node: dict[str, Any]) -> int:
    return len(node)


def _listify(node: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in node.items():
        out[key] = _listify_value(value)
    return out


def _listify_value(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    converted = _listify(value)
    if converted and all(key.isdigit() for key in converted):
        return [converted[key] for key in sorted(converted, key=int)]
    return converted
