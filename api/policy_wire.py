"""Wire types of /v1/policies: what admins send and get back. Never table rows."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

import msgspec
from litestar import Response

from api.downloads import csv_download
from metering.errors import FieldError, validation_error
from metering.policies.versions import PolicyVersion
from metering.settlement.replay import Position, WhatIf
from metering.settlement.whatif_export import changes_csv, whatif_csv

# The what-if's CSV tables (metering/settlement/whatif_export.py), one file each.
CSV_TABLES = ("customers", "changes")


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
        msgspec.Meta(
            description=(
                "RFC 3339 time with its zone; default now. Never in the past, never before "
                "the latest version's, at most the horizon ahead (default 366 days)."
            )
        ),
    ] = None
    note: str = ""


class PolicyWithdraw(msgspec.Struct, forbid_unknown_fields=True):
    reason: Annotated[str, msgspec.Meta(description="Why, shown beside the version.")] = ""


class PolicyWithdrawal(msgspec.Struct):
    withdrawn_at: datetime
    withdrawn_by: str  # the admin key's id ("cli" from the command line)
    reason: str


class PolicyReply(msgspec.Struct):
    version: int  # 0: the deployment's settings, in force until a tenant's first version
    effective_from: datetime | None
    created_at: datetime | None
    created_by: str | None
    note: str
    in_force: bool  # in force now (a version may be written to take effect later)
    document: dict[str, Any]
    withdrawn: PolicyWithdrawal | None = None  # withdrawn before it took effect: never in force


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
        withdrawn=_withdrawal(version),
    )


def _withdrawal(version: PolicyVersion) -> PolicyWithdrawal | None:
    done = version.withdrawn
    return None if done is None else PolicyWithdrawal(done.at, done.by, done.reason)


class WhatIfRequest(msgspec.Struct, forbid_unknown_fields=True):
    period: Annotated[str, msgspec.Meta(description="YYYY-MM or 'current'.")]
    document: Annotated[
        dict[str, Any],
        msgspec.Meta(description="The candidate; fields left out keep the latest version's."),
    ] = msgspec.field(default_factory=dict)


class Amounts(msgspec.Struct):
    billed_micros: int
    credited_micros: int
    held_micros: int  # held for review: nothing posted
    # What the usage cost the platform (the provider-cost catalog), all of it and the part
    # in the usage lines credited; margin after protection = billed - provider cost.
    provider_cost_micros: int
    credited_provider_cost_micros: int
    margin_after_micros: int


class Comparison(msgspec.Struct):
    current: Amounts  # the decisions in force
    candidate: Amounts


class CustomerWhatIf(Comparison):
    customer: str


class OutcomeChange(msgspec.Struct):
    old_outcome: str
    new_outcome: str
    runs: int
    example_runs: list[str]


class WhatIfReply(msgspec.Struct):
    period: str
    candidate: dict[str, Any]
    runs: int
    # Runs also replayed under the policy that decided them (the first 1,000 of each
    # process's share of the period, then one in 16), and of those the ones that reproduced
    # the stored decision: equal unless the replay and settlement disagree (then a few
    # examples).
    checked: int
    reproduced: int
    not_reproduced_examples: list[str]
    # Usage lines of a model without a provider cost (counted at no cost in the cost columns).
    uncosted_lines: int
    total: Comparison
    customers: list[CustomerWhatIf]
    changes: list[OutcomeChange]


# Built positionally from the position's figures: the names must be those, in that order.
assert Amounts.__struct_fields__ == Position.FIGURES


def _amounts(position: Position) -> Amounts:
    return Amounts(*position.figures())


def whatif_reply(report: WhatIf) -> WhatIfReply:
    return WhatIfReply(
        period=report.period,
        candidate=report.candidate.as_json(),
        runs=report.runs,
        checked=report.checked,
        reproduced=report.reproduced,
        not_reproduced_examples=report.not_reproduced,
        uncosted_lines=report.uncosted_lines,
        total=Comparison(_amounts(report.total.current), _amounts(report.total.candidate)),
        customers=[
            CustomerWhatIf(_amounts(side.current), _amounts(side.candidate), customer)
            for customer, side in sorted(report.customers.items())
        ],
        changes=[
            OutcomeChange(old, new, change.runs, change.examples)
            for (old, new), change in sorted(report.changes.items())
        ],
    )


def csv_table(table: str) -> str:
    """The CSV table asked for; 422 on ``$.table`` for another (checked before replaying)."""
    if table not in CSV_TABLES:
        raise validation_error(
            [FieldError("$.table", "invalid_table", "table is customers or changes")]
        )
    return table


def whatif_download(report: WhatIf, table: str) -> Response[str]:
    """The what-if as a CSV attachment: the customers and total, or the outcome changes."""
    if table == "changes":
        return csv_download(changes_csv(report), f"what-if-{report.period}-changes.csv")
    return csv_download(whatif_csv(report), f"what-if-{report.period}.csv")
