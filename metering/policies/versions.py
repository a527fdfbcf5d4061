"""A tenant's policy versions: write one, read them, and find the one in force at a moment.

Versions are append-only and numbered per tenant from 1; version 0 is the settings' default
policy, never stored. The version in force at a moment is the one with the latest
``effective_from`` at or before it, among those not withdrawn (``withdrawals.py``).
``effective_from`` never goes back in time (not before now, not before the previous
version's) and is at most the horizon ahead, so version numbers and effect run in one order
and no decision already made could have been made under a version written later.

Writers of one tenant's policy take its lock first and read the clock (the database's, one
for every API process) only then: a writer that queued behind another starts after it,
instead of finding its own earlier "now" before the version just written.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from metering.errors import FieldError, MeteringError, conflict, not_found, validation_error
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
    withdrawn: Withdrawal | None = None  # withdrawn before it took effect: never in force


@dataclass(frozen=True, slots=True)
class Withdrawal:
    at: datetime
    by: str  # the admin key's id ("cli" from the command line)
    reason: str


def default_version(tenant_id: str, defaults: PolicyDocument) -> PolicyVersion:
    return PolicyVersion(
        tenant_id, DEFAULT_VERSION, defaults, None, None, None, "the deployment's settings"
    )


_COLUMNS = "tenant_id, version, document, effective_from, created_at, created_by, note"
_SELECT = (
    "SELECT v.tenant_id, v.version, v.document, v.effective_from, v.created_at, "
    "v.created_by, v.note, w.withdrawn_at, w.withdrawn_by, w.reason "
    "FROM policy_versions v LEFT JOIN policy_withdrawals w "
    "ON w.tenant_id = v.tenant_id AND w.version = v.version"
)
MAX_NOTE_CHARS = 2_000


def _version(row: tuple[Any, ...]) -> PolicyVersion:
    # Stored documents were validated when written; read back as they were stored.
    withdrawn = Withdrawal(row[7], row[8], row[9]) if row[7:8] and row[7] is not None else None
    return PolicyVersion(
        row[0],
        row[1],
        PolicyDocument.model_validate(row[2]),
        row[3],
        row[4],
        row[5],
        row[6],
        withdrawn,
    )


def in_force_at(versions: list[PolicyVersion], moment: datetime) -> int:
    """The number of the version in force at ``moment`` among a tenant's ``list_versions``
    (a withdrawn version never is)."""
    started = (
        v
        for v in versions
        if v.withdrawn is None and (v.effective_from is None or v.effective_from <= moment)
    )
    return max((v.version for v in started), default=DEFAULT_VERSION)


def list_versions(
    conn: psycopg.Connection[Any],
    tenant_id: str,
    defaults: PolicyDocument,
    *,
    withdrawn: bool = False,
) -> list[PolicyVersion]:
    """The tenant's versions that count, version 0 (the settings) first; with ``withdrawn``
    the withdrawn ones too (for lists a person reads)."""
    kept = "" if withdrawn else " AND w.version IS NULL"
    rows = conn.execute(f"{_SELECT} WHERE v.tenant_id = %s{kept} ORDER BY v.version", (tenant_id,))
    return [default_version(tenant_id, defaults), *map(_version, rows.fetchall())]


def get_version(
    conn: psycopg.Connection[Any], tenant_id: str, version: int, defaults: PolicyDocument
) -> PolicyVersion:
    """One version (0: the settings' default), withdrawn or not; 404 if the tenant has no
    such version."""
    if version == DEFAULT_VERSION:
        return default_version(tenant_id, defaults)
    row = conn.execute(
        f"{_SELECT} WHERE v.tenant_id = %s AND v.version = %s", (tenant_id, version)
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


def lock_policy(conn: psycopg.Connection[Any], tenant_id: str, wait_s: float) -> datetime:
    """Take the tenant's policy lock for this transaction, then read the database's clock.

    One writer per tenant at a time, so two versions never take the same number; the clock
    read after the lock is later than every version written before it. A writer still
    queued after ``wait_s`` gets a retryable 409 ``policy_write_conflict``.
    """
    prior = conn.execute("SELECT current_setting('lock_timeout')").fetchone()
    assert prior is not None
    conn.execute("SELECT set_config('lock_timeout', %s, true)", (f"{int(wait_s * 1000)}ms",))
    try:
        conn.execute(
            "SELECT pg_advisory_xact_lock(hashtext('policy_versions:' || %s))", (tenant_id,)
        )
    except psycopg.errors.LockNotAvailable:
        raise conflict(
            "another write to this tenant's policy is in progress; retry",
            code="policy_write_conflict",
            retry_after_s=1,
        ) from None
    clock = conn.execute(
        "SELECT clock_timestamp(), set_config('lock_timeout', %s, true)", (prior[0],)
    ).fetchone()
    assert clock is not None
    return clock[0]  # type: ignore[no-any-return]


def start_of(
    sent: datetime | None, now: datetime, latest: PolicyVersion, max_lead_s: int | None
) -> datetime:
    """When a new version after ``latest`` takes effect: ``sent``, or now if none was sent.

    422 on ``$.effective_from`` for a sent time before now or before ``latest``'s, or more
    than ``max_lead_s`` ahead; 409 ``policy_version_scheduled`` when none was sent but
    ``latest`` starts later (the error names the version, not a field the client left out).
    """
    floor = latest.effective_from or now
    if sent is None:
        if floor > now:
            raise conflict(
                f"version {latest.version} takes effect at {floor.isoformat()}: send an "
                "effective_from at or after it, or withdraw that version first",
                code="policy_version_scheduled",
                version=latest.version,
                effective_from=floor.isoformat(),
            )
        return now
    if sent < max(now, floor):
        message = f"must not be before {max(now, floor).isoformat()} (now, or the latest version's)"
        raise _problem([FieldError("$.effective_from", "effective_from_in_past", message)])
    if max_lead_s is not None and sent > now + timedelta(seconds=max_lead_s):
        horizon = (now + timedelta(seconds=max_lead_s)).isoformat()
        lead = f"{max_lead_s} s ({max_lead_s / 86400:g} days)"
        message = f"at most {lead} ahead (the horizon): not after {horizon}"
        raise _problem([FieldError("$.effective_from", "effective_from_too_far", message)])
    return sent


def create_version(
    conn: psycopg.Connection[Any],
    tenant_id: str,
    raw: object,
    *,
    created_by: str,
    defaults: PolicyDocument,
    now: datetime | None = None,
    effective_from: datetime | None = None,
    note: str = "",
    max_lead_s: int | None = None,
    wait_s: float = 5.0,
) -> PolicyVersion:
    """Write the tenant's next policy version, in force from ``effective_from`` (now).

    Fields the document leaves out keep the latest version's values, so a tenant writes only
    what it changes. 422 naming each bad field (``$.document.rules.R7.under_micros``), or
    ``$.effective_from`` as ``start_of`` says. ``now`` (a test's fixed moment) defaults to
    the database's clock, read once the tenant's lock is held; ``max_lead_s`` is the
    horizon (``Settings.policy_max_lead_s``; None: none, for tests that write history).
    """
    if len(note) > MAX_NOTE_CHARS or "\x00" in note:
        raise _problem(
            [FieldError("$.note", "invalid_note", f"at most {MAX_NOTE_CHARS} characters")]
        )
    clock = lock_policy(conn, tenant_id, wait_s)
    moment = clock if now is None else now
    latest = list_versions(conn, tenant_id, defaults)[-1]
    document = parse_over(raw, latest.document)
    start = start_of(effective_from, moment, latest, max_lead_s)
    row = conn.execute(
        "INSERT INTO policy_versions "
        "(tenant_id, version, document, effective_from, created_by, note) "
        "SELECT %s, coalesce(max(version), 0) + 1, %s, %s, %s, %s "
        f"FROM policy_versions WHERE tenant_id = %s RETURNING {_COLUMNS}",
        (tenant_id, Jsonb(document.as_json()), start, created_by, note, tenant_id),
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
    """The versions of these tenants that count (none withdrawn), in order of effect."""
    book = PolicyBook(defaults)
    rows = conn.execute(
        f"{_SELECT} WHERE v.tenant_id = ANY(%s) AND w.version IS NULL "
        "ORDER BY v.tenant_id, v.effective_from, v.version",
        (sorted(set(tenant_ids)),),
    ).fetchall()
    for row in rows:
        book.versions.setdefault(row[0], []).append(_version(row))
    return book
