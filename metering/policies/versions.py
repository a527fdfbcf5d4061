"""A tenant's policy versions: write one, read them, and find the one in force at a moment.

Versions are append-only and numbered per tenant from 1; version 0 is the settings' default
policy, never stored. The version in force at a moment is the one with the latest
``effective_from`` at or before it. ``effective_from`` never goes back in time (not before
now, not before the previous version's), so version numbers and effect run in one order
and no decision already made could have been made under a version written later.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from metering.errors import FieldError, MeteringError, not_found, validation_error
from metering.policy.document import PolicyDocument, PolicyProblem, diff_policies, parse_policy

DEFAULT_VERSION = 0


@dataclass(frozen=True, slots=True)
class PolicyVersion:
    tenant_id: str
    version: int
    document: PolicyDocument
    effective_from: datetime | None  # None for version 0: in force since always
    created_at: datetime | None
    created_by: str | None
    note: str = ""


def default_version(tenant_id: str, defaults: PolicyDocument) -> PolicyVersion:
    return PolicyVersion(
        tenant_id, DEFAULT_VERSION, defaults, None, None, None, "the deployment's settings"
    )


_COLUMNS = "tenant_id, version, document, effective_from, created_at, created_by, note"
_SELECT = f"SELECT {_COLUMNS} FROM policy_versions"
MAX_NOTE_CHARS = 2_000


def _version(row: tuple[Any, ...]) -> PolicyVersion:
    # Stored documents were validated when written; read back as they were stored.
    return PolicyVersion(
        row[0], row[1], PolicyDocument.model_validate(row[2]), row[3], row[4], row[5], row[6]
    )


def in_force_at(versions: list[PolicyVersion], moment: datetime) -> int:
    """The number of the version in force at ``moment`` among a tenant's ``list_versions``."""
    started = (v for v in versions if v.effective_from is None or v.effective_from <= moment)
    return max((v.version for v in started), default=DEFAULT_VERSION)


def list_versions(
    conn: psycopg.Connection[Any], tenant_id: str, defaults: PolicyDocument
) -> list[PolicyVersion]:
    """Every version of the tenant's policy, version 0 (the settings) first."""
    rows = conn.execute(f"{_SELECT} WHERE tenant_id = %s ORDER BY version", (tenant_id,))
    return [default_version(tenant_id, defaults), *map(_version, rows.fetchall())]


def get_version(
    conn: psycopg.Connection[Any], tenant_id: str, version: int, defaults: PolicyDocument
) -> PolicyVersion:
    """One version (0: the settings' default); 404 if the tenant has no such version."""
    if version == DEFAULT_VERSION:
        return default_version(tenant_id, defaults)
    row = conn.execute(
        f"{_SELECT} WHERE tenant_id = %s AND version = %s", (tenant_id, version)
    ).fetchone()
    if row is None:
        raise not_found(f"no policy version {version}", code="policy_version_not_found")
    return _version(row)


def diff_versions(
    conn: psycopg.Connection[Any],
    tenant_id: str,
    old: int,
    new: int,
    defaults: PolicyDocument,
) -> list[tuple[str, Any, Any]]:
    """(field path, value in ``old``, value in ``new``) for each field that differs."""
    return diff_policies(
        get_version(conn, tenant_id, old, defaults).document,
        get_version(conn, tenant_id, new, defaults).document,
    )


def _problem(errors: list[FieldError]) -> MeteringError:
    error = validation_error(errors)
    error.title = "Invalid policy"
    return error


def create_version(
    conn: psycopg.Connection[Any],
    tenant_id: str,
    raw: object,
    *,
    created_by: str,
    now: datetime,
    defaults: PolicyDocument,
    effective_from: datetime | None = None,
    note: str = "",
) -> PolicyVersion:
    """Write the tenant's next policy version, in force from ``effective_from`` (now).

    Fields the document leaves out keep the latest version's values, so a tenant writes only
    what it changes. 422 naming each bad field (``$.document.rules.R7.under_micros``), or
    ``$.effective_from`` when it is in the past or before the latest version's.
    """
    if len(note) > MAX_NOTE_CHARS or "\x00" in note:
        raise _problem(
            [FieldError("$.note", "invalid_note", f"at most {MAX_NOTE_CHARS} characters")]
        )
    # One writer per tenant at a time, so two versions never take the same number.
    conn.execute("SELECT pg_advisory_xact_lock(hashtext('policy_versions:' || %s))", (tenant_id,))
    latest = list_versions(conn, tenant_id, defaults)[-1]
    document = parse_over(raw, latest.document)
    start = effective_from or now
    floor = max(now, latest.effective_from or now)
    if start < floor:
        raise _problem(
            [
                FieldError(
                    "$.effective_from",
                    "effective_from_in_past",
                    f"must not be before {floor.isoformat()} (now, or the latest version's)",
                )
            ]
        )
    row = conn.execute(
        "INSERT INTO policy_versions "
        "(tenant_id, version, document, effective_from, created_by, note) "
        f"VALUES (%s, %s, %s, %s, %s, %s) RETURNING {_COLUMNS}",
        (tenant_id, latest.version + 1, Jsonb(document.as_json()), start, created_by, note),
    ).fetchone()
    assert row is not None
    return _version(row)


def parse_over(raw: object, base: PolicyDocument) -> PolicyDocument:
    """``raw`` over ``base`` (fields left out keep its values); 422 naming each bad field
    as ``$.document.<path>``."""
    try:
        return parse_policy(raw, defaults=base)
    except PolicyProblem as problem:
        raise _problem(
            [FieldError(_json_path(path), "invalid_policy", msg) for path, msg in problem.problems]
        ) from None


def _json_path(path: str) -> str:
    return "$.document" if path == "(document)" else f"$.document.{path}"


@dataclass
class PolicyBook:
    """The policy versions of some tenants, for settling a chunk of their runs.

    Loaded once per chunk; each version's ``PolicyConfig`` is built once.
    """

    defaults: PolicyDocument
    versions: dict[str, list[PolicyVersion]] = field(default_factory=dict)

    def in_force(self, tenant_id: str, moment: datetime) -> PolicyVersion:
        """The version with the latest ``effective_from`` at or before ``moment``."""
        versions = self.versions.get(tenant_id, ())
        starts = [v.effective_from for v in versions if v.effective_from is not None]
        index = bisect.bisect_right(starts, moment)
        if index == 0:
            return default_version(tenant_id, self.defaults)
        return versions[index - 1]


def load_book(
    conn: psycopg.Connection[Any], tenant_ids: Iterable[str], defaults: PolicyDocument
) -> PolicyBook:
    """The versions of these tenants, in order of effect."""
    book = PolicyBook(defaults)
    rows = conn.execute(
        f"{_SELECT} WHERE tenant_id = ANY(%s) ORDER BY tenant_id, effective_from, version",
        (sorted(set(tenant_ids)),),
    ).fetchall()
    for row in rows:
        book.versions.setdefault(row[0], []).append(_version(row))
    return book
