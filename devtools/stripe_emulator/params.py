"""Coercion and validation of parsed v1 parameters, with Stripe's error messages."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from devtools.stripe_emulator.errors import (
    invalid_integer,
    invalid_request,
    missing_param,
    unknown_param,
)
from devtools.stripe_emulator.forms import Params

COMMON = frozenset({"expand"})


def check_known(params: Params, allowed: Iterable[str]) -> None:
    known = COMMON | set(allowed)
    for name in params:
        if name not in known:
            raise unknown_param(name)


def required_str(params: Params, name: str, *, label: str | None = None) -> str:
    value = params.get(name)
    if value is None or value == "":
        raise missing_param(label or name)
    if not isinstance(value, str):
        raise invalid_request(f"Invalid string: {value!r}", param=label or name)
    return value


def optional_str(params: Params, name: str) -> str | None:
    value = params.get(name)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise invalid_request(f"Invalid string: {value!r}", param=name)
    return value


def parse_int(value: Any, param: str) -> int:
    if not isinstance(value, str):
        raise invalid_integer(param, value)
    text = value.strip()
    digits = text[1:] if text[:1] in "+-" else text
    if not digits.isdigit():
        raise invalid_integer(param, value)
    return int(text)


def required_int(params: Params, name: str) -> int:
    if params.get(name) in (None, ""):
        raise missing_param(name)
    return parse_int(params[name], name)


def optional_int(params: Params, name: str) -> int | None:
    if params.get(name) in (None, ""):
        return None
    return parse_int(params[name], name)


def hash_param(params: Params, name: str) -> dict[str, Any]:
    value = params.get(name, {})
    if value == "":
        return {}
    if not isinstance(value, dict):
        raise invalid_request(f"Invalid object: {name}", param=name)
    return value


def string_map(params: Params, name: str) -> dict[str, str]:
    value = hash_param(params, name)
    for key, item in value.items():
        if not isinstance(item, str):
            raise invalid_request(f"Invalid string: {name}[{key}]", param=f"{name}[{key}]")
    return dict(value)
