"""Wire types of /v1/policies: what admins send and get back. Never table rows."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

import msgspec

from metering.policies.versions import PolicyVersion


class PolicyCreate(msgspec.Struct, forbid_unknown_fields=True):
    document: Annotated[
        dict[str, Any],
        msgspec.Meta(
            description=(
                "The policy document (docs/policies.md). Fields left out keep the latest "
                "version's values."
            )
        ),
    ]
    effective_from: Annotated[
        str | None,
        msgspec.Meta(description="RFC 3339 time with its zone; default now. Never in the past."),
    ] = None
    note: str = ""


class PolicyReply(msgspec.Struct):
    version: int  # 0: the deployment's settings, in force until a tenant's first version
    effective_from: datetime | None
    created_at: datetime | None
    created_by: str | None
    note: str
    in_force: bool  # in force now (a version may be written to take effect later)
    document: dict[str, Any]


class PolicyChange(msgspec.Struct):
    path: str
    old: Any
    new: Any


class PolicyDiffReply(msgspec.Struct):
    from_version: int
    to_version: int
    changes: list[PolicyChange]


def policy_reply(version: PolicyVersion, in_force: bool) -> PolicyReply:
    return PolicyReply(
        version=version.version,
        effective_from=version.effective_from,
        created_at=version.created_at,
        created_by=version.created_by,
        note=version.note,
        in_force=in_force,
        document=version.document.as_json(),
    )
