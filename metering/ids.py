"""The id grammar: which strings may name a tenant, a customer or a run.

Every such id ends up as one segment of a URL (``/v1/runs/{run}``,
``/v1/customers/{customer}/statements/…``, ``/console/runs/{run}``), in a file name
(the statement CSV's ``Content-Disposition``) and in spreadsheet cells, so the grammar
keeps to characters that mean nothing in any of them::

    id = ALNUM *( ALNUM / "-" / "_" / "." / ":" / "@" / "~" / "+" )   ; ASCII only

that is, 1 to ``max_chars`` characters, starting with a letter or a digit. So an id is
never ``.`` or ``..`` (which clients fold away as dot segments), never holds ``/``, ``?``,
``#``, ``%``, spaces, quotes or control characters, and never starts with the characters
that make a spreadsheet read a cell as a formula (``= + - @``). Ids are case-sensitive.
Ingest refuses anything else with 422 ``invalid_id``; keys are refused one naming a
tenant or customer outside it.

Ids stored before this rule (only possible in a deployment older than it) are still
reached by their percent-encoded form; see ``api/paths.py``.

CloudEvents ``id`` and ``source`` are not ids in this sense: they never appear in a URL
or a file name, only as the ``(source, id)`` deduplication key, so they keep the
CloudEvents rules (any non-empty string; ``source`` is a URI-reference, usually with
``/``).
"""

from __future__ import annotations

import re
from enum import Enum

ID_CHARS = r"A-Za-z0-9._:@~+-"
ID_PATTERN = rf"^[A-Za-z0-9][{ID_CHARS}]*$"
_ID = re.compile(ID_PATTERN)


class IdKind(Enum):
    """What an id names, and the most characters it may have (the column widths)."""

    TENANT = ("tenant", 64)
    CUSTOMER = ("customer", 128)
    RUN = ("run", 200)

    def __init__(self, noun: str, max_chars: int) -> None:
        self.noun = noun
        self.max_chars = max_chars


def id_problem(value: object, kind: IdKind) -> str | None:
    """Why ``value`` is not a valid id of ``kind``, as a sentence; ``None`` when it is."""
    if not isinstance(value, str):
        return f"a {kind.noun} id must be a string"
    if not 0 < len(value) <= kind.max_chars:
        return f"a {kind.noun} id must be 1 to {kind.max_chars} characters"
    # fullmatch, not match + "$": "$" also matches before a trailing newline.
    if not _ID.fullmatch(value):
        return (
            f"a {kind.noun} id must start with a letter or digit and hold only ASCII "
            "letters, digits and - _ . : @ ~ +"
        )
    return None


def is_valid_id(value: object, kind: IdKind) -> bool:
    return id_problem(value, kind) is None


def lookup_problem(value: str, kind: IdKind) -> str | None:
    """Why ``value`` cannot name any stored id of ``kind``, or ``None`` when it may.

    Looser than :func:`id_problem` on purpose: ids stored before the grammar (``org-7/run-1``)
    are still looked up. Refused are only values no column could hold — longer than the
    column, or with a NUL or an unpaired surrogate, which PostgreSQL text cannot store — so
    a route can answer 422 for them instead of a pointless lookup.
    """
    if not 0 < len(value) <= kind.max_chars:
        return f"a {kind.noun} id is 1 to {kind.max_chars} characters"
    if "\x00" in value or _unencodable(value):
        return f"a {kind.noun} id cannot hold a NUL character or an unpaired surrogate"
    return None


def _unencodable(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False
