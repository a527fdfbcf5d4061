"""``fairmeter policy …``: show, set, withdraw and diff a tenant's protection policy versions.

The operator acts as an admin of ``--tenant``, through the same use cases as /v1/policies
(the same validation, the same field paths in errors). See docs/policies.md.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from metering.config import load_cli_settings
from metering.db import create_db_engine, raw_transaction
from metering.errors import MeteringError
from metering.policies import versions
from metering.policies.defaults import settings_policy
from metering.policies.versions import PolicyVersion
from metering.policies.withdrawals import withdraw_version
from metering.settlement.replay import WhatIf
from metering.settlement.replay_shards import Parallelism
from metering.settlement.whatif import what_if
from metering.settlement.whatif_export import changes_csv, whatif_csv


def _header(version: PolicyVersion, current: int) -> str:
    since = version.effective_from.isoformat() if version.effective_from else "always"
    state = "in force" if version.version == current else "not in force"
    if version.withdrawn is not None:
        state = f"withdrawn {version.withdrawn.at.isoformat()} by {version.withdrawn.by}"
    return f"version {version.version}\t{state}\tfrom {since}\t{version.note}"


def _assignment(text: str) -> tuple[list[str], Any]:
    """``rules.R4=false`` → (["rules", "R4"], False); a value that is not JSON is a string."""
    path, sep, raw = text.partition("=")
    if not sep or not path:
        raise click.BadParameter(f"{text!r}: expected FIELD=VALUE, e.g. cap_runs=5")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return path.split("."), value


def _document(file: str | None, assignments: tuple[str, ...]) -> dict[str, Any]:
    document: dict[str, Any] = {}
    if file is not None:
        text = sys.stdin.read() if file == "-" else Path(file).read_text()
        loaded = json.loads(text)
        if not isinstance(loaded, dict):
            raise click.BadParameter("the policy file must hold a JSON object", param_hint="FILE")
        document = loaded
    for assignment in assignments:
        path, value = _assignment(assignment)
        node = document
        for key in path[:-1]:
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                raise click.BadParameter(f"{assignment!r}: {key} is not an object")
        node[path[-1]] = value
    return document


def _fail(error: MeteringError) -> click.ClickException:
    lines = [f"{e.path}: {e.message}" for e in error.errors] or [error.detail]
    return click.ClickException(f"{error.code}: " + "; ".join(lines))


@click.group()
def policy() -> None:
    """A tenant's protection policy: knobs and rule switches, versioned (docs/policies.md)."""


@policy.command("show")
@click.option("--tenant", required=True)
@click.option("--version", "number", type=int, help="Default: the version in force now.")
@click.option("--all", "show_all", is_flag=True, help="List every version instead.")
def show(tenant: str, number: int | None, show_all: bool) -> None:
    """Print a version's document as JSON (a header line on stderr), or list them."""
    settings = load_cli_settings()
    with raw_transaction(create_db_engine(settings)) as conn:
        found = versions.list_versions(conn, tenant, settings_policy(settings), withdrawn=True)
    current = versions.in_force_at(found, datetime.now(UTC))
    if show_all:
        for version in found:
            click.echo(_header(version, current))
        return
    wanted = current if number is None else number
    chosen = [v for v in found if v.version == wanted]
    if not chosen:
        raise click.ClickException(f"policy_version_not_found: no policy version {wanted}")
    click.echo(_header(chosen[0], current), err=True)
    click.echo(json.dumps(chosen[0].document.as_json(), indent=2))


@policy.command("set")
@click.option("--tenant", required=True)
@click.option("--file", "file", help="A JSON policy document ('-': stdin).")
@click.option("--set", "assignments", multiple=True, help="FIELD=VALUE, e.g. rules.R4=false.")
@click.option("--effective-from", help="RFC 3339 time with its zone; default now.")
@click.option("--note", default="", help="Why this version (shown with it).")
def set_policy(
    tenant: str,
    file: str | None,
    assignments: tuple[str, ...],
    effective_from: str | None,
    note: str,
) -> None:
    """Write the next version: the file and --set fields over the latest version."""
    start = None
    if effective_from is not None:
        start = datetime.fromisoformat(effective_from)
        if start.tzinfo is None:
            raise click.BadParameter("give the time zone, e.g. …Z", param_hint="--effective-from")
    document = _document(file, assignments)
    settings = load_cli_settings()
    try:
        with raw_transaction(create_db_engine(settings)) as conn:
            made = versions.create_version(
                conn,
                tenant,
                document,
                created_by="cli",
                defaults=settings_policy(settings),
                effective_from=start,
                note=note,
                max_lead_s=settings.policy_max_lead_s,
                wait_s=settings.policy_write_wait_s,
            )
    except MeteringError as error:
        raise _fail(error) from None
    assert made.effective_from is not None
    click.echo(f"version {made.version} in force from {made.effective_from.isoformat()}")


@policy.command("withdraw")
@click.option("--tenant", required=True)
@click.option("--version", "number", type=click.IntRange(0, 2**31 - 1), required=True)
@click.option("--reason", default="", help="Why (recorded with the withdrawal).")
def withdraw(tenant: str, number: int, reason: str) -> None:
    """Withdraw a version that has not taken effect: it is then never in force."""
    settings = load_cli_settings()
    try:
        with raw_transaction(create_db_engine(settings)) as conn:
            done = withdraw_version(
                conn,
                tenant,
                number,
                withdrawn_by="cli",
                defaults=settings_policy(settings),
                reason=reason,
                wait_s=settings.policy_write_wait_s,
            )
    except MeteringError as error:
        raise _fail(error) from None
    assert done.withdrawn is not None
    click.echo(f"version {number} withdrawn at {done.withdrawn.at.isoformat()}")


@policy.command("diff")
@click.option("--tenant", required=True)
@click.option("--from", "old", type=int, help="Default: the version before --to.")
@click.option("--to", "new", type=int, help="Default: the latest version.")
def diff(tenant: str, old: int | None, new: int | None) -> None:
    """Each field that differs: path, old value, new value (JSON), tab-separated."""
    settings = load_cli_settings()
    defaults = settings_policy(settings)
    try:
        with raw_transaction(create_db_engine(settings)) as conn:
            if new is None:
                new = versions.list_versions(conn, tenant, defaults)[-1].version
            old = max(new - 1, 0) if old is None else old
            changes = versions.diff_versions(conn, tenant, old, new, defaults)
    except MeteringError as error:
        raise _fail(error) from None
    click.echo(f"version {old} → {new}: {len(changes)} change(s)", err=True)
    for path, before, after in changes:
        click.echo(f"{path}\t{json.dumps(before)}\t{json.dumps(after)}")


# Micro-USD, exact: as the decisions in force have them, then under the candidate.
WHAT_IF_COLUMNS = (
    "billed_micros",
    "candidate_billed_micros",
    "credited_micros",
    "candidate_credited_micros",
    "held_micros",
    "candidate_held_micros",
    "credited_provider_cost_micros",
    "candidate_credited_provider_cost_micros",
    "margin_after_micros",
    "candidate_margin_after_micros",
)


@policy.command("what-if")
@click.option("--tenant", required=True)
@click.option("--period", required=True, help="YYYY-MM or 'current'.")
@click.option("--policy", "file", help="A candidate JSON policy document ('-': stdin).")
@click.option("--set", "assignments", multiple=True, help="FIELD=VALUE over the latest version.")
@click.option(
    "--csv", "as_csv", is_flag=True, help="CSV as the API's: a row per customer and a total row."
)
@click.option(
    "--table",
    type=click.Choice(["customers", "changes"]),
    default="customers",
    help="With --csv: the customers (default) or the outcome changes.",
)
def what_if_command(
    tenant: str,
    period: str,
    file: str | None,
    assignments: tuple[str, ...],
    as_csv: bool,
    table: str,
) -> None:
    """Replay the period's settled runs under a candidate policy; writes nothing."""
    document = _document(file, assignments)
    settings = load_cli_settings()
    try:
        with raw_transaction(create_db_engine(settings)) as conn:
            report = what_if(
                conn,
                tenant,
                period,
                document,
                settings_policy(settings),
                datetime.now(UTC),
                Parallelism.in_process(settings),
            )
    except MeteringError as error:
        raise _fail(error) from None
    if as_csv:
        text = changes_csv(report) if table == "changes" else whatif_csv(report)
        click.echo(text, nl=False)
    else:
        _print_what_if(report)


def _print_what_if(report: WhatIf) -> None:
    """The what-if for a person: a line, tab-separated micros per customer, the changes."""
    click.echo(
        f"{report.runs} run(s) of {report.period}; "
        f"{report.reproduced} of {report.checked} checked reproduced"
    )
    click.echo(
        "customer\tbilled now\tbilled then\tcredited now\tcredited then\theld now\theld then"
        "\tprotection cost now\tprotection cost then\tmargin now\tmargin then"
    )
    rows = [*sorted(report.customers.items()), ("TOTAL", report.total)]
    for customer, side in rows:
        current, candidate = side.current, side.candidate
        figures = (
            current.billed_micros,
            candidate.billed_micros,
            current.credited_micros,
            candidate.credited_micros,
            current.held_micros,
            candidate.held_micros,
            current.credited_provider_cost_micros,
            candidate.credited_provider_cost_micros,
            current.margin_after_micros,
            candidate.margin_after_micros,
        )
        click.echo("\t".join([customer, *map(str, figures)]))
    for (old, new), change in sorted(report.changes.items()):
        click.echo(f"{old} → {new}: {change.runs} run(s), e.g. {', '.join(change.examples)}")
