"""Pure validation of CloudEvents 1.0 (already decoded to dicts) into canonical events.

Every problem is reported with the JSON path of the field at fault, and all problems of a
request are reported at once so a client can fix a batch in one go.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import msgspec

from metering.catalogue import (
    CLOUDEVENTS,
    EVENT_TYPES,
    MAX_COUNT,
    MAX_STEP,
    MAX_TEXT,
    FieldSpec,
)
from metering.errors import FieldError
from metering.ids import IdKind, id_problem
from metering.timestamps import canonical_time, parse_rfc3339

CORE_ATTRIBUTES = ("specversion", "id", "source", "type", "subject", "time")
# Attributes that describe the transport, not the event: excluded from the content hash so
# that the same event sent structured and then binary is a duplicate, not a conflict.
TRANSPORT_ATTRIBUTES = frozenset({"datacontenttype", "dataschema"})
EXTENSION_NAME = re.compile(r"^[a-z0-9]{1,20}$")
JSON_CONTENT_TYPE = re.compile(r"^application/(?:[\w.+-]+\+)?json(?:\s*;.*)?$", re.IGNORECASE)
# What a PostgreSQL text or jsonb value cannot hold: NUL, and UTF-16 surrogates, which are
# not characters (JSON can carry one as an escape; a Python caller can pass one).
UNSTORABLE_CHARACTER = re.compile(r"[\x00\ud800-\udfff]")


@dataclass(frozen=True, slots=True)
class TimeWindow:
    """Events may be at most ``max_future`` ahead of ``now`` and ``max_age`` old."""

    now: datetime
    max_future: timedelta
    max_age: timedelta


@dataclass(frozen=True, slots=True)
class ValidEvent:
    """A validated event in canonical form, ready to store."""

    index: int
    source: str
    id: str
    type: str
    subject: str
    time: datetime
    customer: str
    data: dict[str, Any]
    attributes: dict[str, Any]
    body_hash: bytes
    # How it arrived (``metering.ingest.protocol``): not part of the event's content, but
    # a run's usage must all come one way.
    protocol: str = CLOUDEVENTS


# The canonical form is the bytes of ``json.dumps(value, sort_keys=True,
# separators=(",", ":"), ensure_ascii=False)`` in UTF-8, which every stored hash was made
# with: a retried event must hash as it did when it was first accepted, or it is refused
# as a conflict. msgspec writes the same bytes for every value validation lets through
# (strings, integers of any size, booleans, null, objects, arrays; no floats), five times
# faster; tests/unit/test_canonical_hash.py holds the two to that.
_canonical = msgspec.json.Encoder(order="sorted")


def content_hash(attributes: Mapping[str, Any], data: Mapping[str, Any]) -> bytes:
    """SHA-256 of the canonical JSON of attributes and data (sorted keys, no spaces)."""
    return hashlib.sha256(_canonical_json(attributes, data)).digest()


def _canonical_json(attributes: Mapping[str, Any], data: Mapping[str, Any]) -> bytes:
    return _canonical.encode({"attributes": attributes, "data": data})


def _check_field(path: str, value: Any, spec: FieldSpec) -> FieldError | None:
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if spec.kind in ("count", "step", "attempt"):
        low = 1 if spec.kind == "attempt" else 0
        high = MAX_COUNT if spec.kind == "count" else MAX_STEP
        if not is_int:
            return FieldError(path, "invalid_type", "must be an integer")
        if not low <= value <= high:
            return FieldError(path, "out_of_range", f"must be between {low} and {high}")
    elif spec.kind == "text":
        if not isinstance(value, str):
            return FieldError(path, "invalid_type", "must be a string")
        if not 0 < len(value) <= MAX_TEXT:
            return FieldError(path, "invalid_length", f"must be 1 to {MAX_TEXT} characters")
    elif spec.kind == "bool":
        if not isinstance(value, bool):
            return FieldError(path, "invalid_type", "must be true or false")
    elif spec.kind == "choice" and value not in spec.choices:
        return FieldError(path, "invalid_value", f"must be one of {', '.join(spec.choices)}")
    return None


def _validate_data(path: str, event_type: str, data: Any) -> list[FieldError]:
    if not isinstance(data, dict):
        return [FieldError(path, "invalid_type", "data must be a JSON object")]
    errors: list[FieldError] = []
    problem = _id_error(data.get("customer"), f"{path}.customer", IdKind.CUSTOMER)
    if problem:
        errors.append(problem)
    specs = EVENT_TYPES[event_type]
    for name, spec in specs.items():
        if name not in data or data[name] is None:
            if spec.required:
                errors.append(FieldError(f"{path}.{name}", "missing_field", f"{name} is required"))
            continue
        problem = _check_field(f"{path}.{name}", data[name], spec)
        if problem:
            errors.append(problem)
    for name in data:
        if name != "customer" and name not in specs:
            errors.append(
                FieldError(f"{path}.{name}", "unknown_field", f"{event_type} has no field {name}")
            )
    return errors


def _text_attribute(raw: Mapping[str, Any], name: str, path: str, limit: int) -> FieldError | None:
    value = raw.get(name)
    if value is None:
        return FieldError(f"{path}.{name}", "missing_field", f"{name} is required")
    if not isinstance(value, str) or not 0 < len(value) <= limit:
        return FieldError(f"{path}.{name}", "invalid_type", f"must be a string of 1-{limit} chars")
    return None


def _id_error(value: Any, path: str, kind: IdKind) -> FieldError | None:
    """Ids become URL segments and file names, so they follow :mod:`metering.ids`."""
    if value is None:
        return FieldError(path, "missing_field", f"{path.rsplit('.', 1)[-1]} is required")
    if not isinstance(value, str):
        return FieldError(path, "invalid_type", "must be a string")
    problem = id_problem(value, kind)
    return FieldError(path, "invalid_id", problem) if problem else None


def _validate_attributes(
    raw: Mapping[str, Any], path: str, window: TimeWindow
) -> tuple[list[FieldError], datetime | None]:
    errors: list[FieldError] = []
    if raw.get("specversion") != "1.0":
        errors.append(FieldError(f"{path}.specversion", "invalid_value", "specversion must be 1.0"))
    for name, limit in (("id", 255), ("source", 255), ("type", 64)):
        problem = _text_attribute(raw, name, path, limit)
        if problem:
            errors.append(problem)
    subject_problem = _id_error(raw.get("subject"), f"{path}.subject", IdKind.RUN)
    if subject_problem:
        errors.append(subject_problem)
    event_type = raw.get("type")
    if isinstance(event_type, str) and event_type not in EVENT_TYPES:
        errors.append(
            FieldError(f"{path}.type", "unknown_type", f"unknown event type {event_type}")
        )
    content_type = raw.get("datacontenttype")
    if content_type is not None and (
        not isinstance(content_type, str) or not JSON_CONTENT_TYPE.match(content_type)
    ):
        errors.append(FieldError(f"{path}.datacontenttype", "invalid_value", "data must be JSON"))
    moment = _validate_time(raw.get("time"), f"{path}.time", window, errors)
    for name, value in raw.items():
        if name in CORE_ATTRIBUTES or name in TRANSPORT_ATTRIBUTES or name in ("data",):
            continue
        if name == "data_base64":
            errors.append(FieldError(f"{path}.{name}", "invalid_value", "data must be JSON"))
        elif not EXTENSION_NAME.match(name):
            errors.append(FieldError(f"{path}.{name}", "invalid_name", "bad attribute name"))
        elif not isinstance(value, str | int | bool) or (
            isinstance(value, str) and len(value) > 1024
        ):
            errors.append(FieldError(f"{path}.{name}", "invalid_type", "bad extension value"))
    return errors, moment


def _validate_time(
    value: Any, path: str, window: TimeWindow, errors: list[FieldError]
) -> datetime | None:
    if value is None:
        errors.append(FieldError(path, "missing_field", "time is required"))
        return None
    moment = parse_rfc3339(value) if isinstance(value, str) else None
    if moment is None:
        errors.append(FieldError(path, "invalid_time", "time must be an RFC 3339 timestamp"))
    elif moment > window.now + window.max_future:
        errors.append(FieldError(path, "time_in_future", "time is too far in the future"))
    elif moment < window.now - window.max_age:
        errors.append(FieldError(path, "time_too_old", "time is older than the ingest window"))
    return moment


def _unstorable_texts(raw: Mapping[str, Any], path: str) -> list[FieldError]:
    """Each stored string of the event that PostgreSQL cannot store, by its path.

    Refused here, not by the database: a database error fails a whole transaction, which may
    hold other requests too (group commit). Names need no check: one holding such a
    character is no field or extension name, and is refused as that.
    """
    errors = []
    data = raw.get("data")
    for prefix, values in ((path, raw), (f"{path}.data", data if isinstance(data, dict) else {})):
        for name, value in values.items():
            found = UNSTORABLE_CHARACTER.search(value) if isinstance(value, str) else None
            if found and name not in TRANSPORT_ATTRIBUTES:
                errors.append(
                    FieldError(
                        f"{prefix}.{name}",
                        "invalid_character",
                        f"U+{ord(found.group()):04X} at position {found.start()} cannot be "
                        "stored (NUL and lone UTF-16 surrogates are not allowed in text)",
                    )
                )
    return errors


def validate_event(
    raw: Any, path: str, index: int, window: TimeWindow
) -> ValidEvent | list[FieldError]:
    """One decoded CloudEvent → :class:`ValidEvent`, or every error found in it."""
    if not isinstance(raw, dict):
        return [FieldError(path, "invalid_type", "an event must be a JSON object")]
    errors, moment = _validate_attributes(raw, path, window)
    event_type = raw.get("type")
    if "data" not in raw:
        errors.append(FieldError(f"{path}.data", "missing_field", "data is required"))
    elif isinstance(event_type, str) and event_type in EVENT_TYPES:
        errors.extend(_validate_data(f"{path}.data", event_type, raw["data"]))
    if errors:  # the error path: cost does not matter, all of the event's errors do
        # One error per field: an id holding a NUL is outside the id grammar, and that is
        # the more useful thing to say about it.
        named = {error.path for error in errors}
        return errors + [e for e in _unstorable_texts(raw, path) if e.path not in named]
    assert moment is not None
    attributes = {
        name: value
        for name, value in raw.items()
        if name != "data" and name not in TRANSPORT_ATTRIBUTES
    }
    attributes["time"] = canonical_time(moment)
    data = dict(raw["data"])
    # The canonical JSON holds every stored string: it escapes a NUL as \u0000 and cannot
    # encode a surrogate. So the scan string by string, which would cost each event about
    # as much as decoding it, runs only when there is a string at fault to name.
    try:
        canonical: bytes | None = _canonical_json(attributes, data)
    except UnicodeEncodeError:
        canonical = None
    if canonical is None or b"\\u0000" in canonical:
        unstorable = _unstorable_texts(raw, path)
        if unstorable:
            return unstorable
        assert canonical is not None, "a surrogate in a stored string that the scan missed"
    return ValidEvent(
        index=index,
        source=raw["source"],
        id=raw["id"],
        type=raw["type"],
        subject=raw["subject"],
        time=moment,
        customer=data["customer"],
        data=data,
        attributes=attributes,
        body_hash=hashlib.sha256(canonical).digest(),
    )


def validate_batch(
    raws: Sequence[Any], window: TimeWindow, *, single: bool = False
) -> tuple[list[ValidEvent], list[FieldError]]:
    """Validate every event; paths are ``$`` for a single event, ``$[i]`` in a batch."""
    valid: list[ValidEvent] = []
    errors: list[FieldError] = []
    for index, raw in enumerate(raws):
        path = "$" if single else f"$[{index}]"
        result = validate_event(raw, path, index, window)
        if isinstance(result, list):
            errors.extend(result)
        else:
            valid.append(result)
    errors.extend(_customer_mismatches(valid, single=single))
    return valid, errors


def _customer_mismatches(events: Sequence[ValidEvent], *, single: bool) -> list[FieldError]:
    """All events of one run inside a request must name the same customer."""
    first_customer: dict[str, str] = {}
    errors = []
    for event in events:
        expected = first_customer.setdefault(event.subject, event.customer)
        if event.customer != expected:
            path = "$.data.customer" if single else f"$[{event.index}].data.customer"
            errors.append(
                FieldError(path, "customer_mismatch", f"run {event.subject} belongs to {expected}")
            )
    return errors
