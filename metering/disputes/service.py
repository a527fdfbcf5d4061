"""Support use cases: open and resolve disputes, credit a run, release a held run.

Every action runs in the caller's single transaction together with its audit row, and
money only moves through settlement (a new decision version with ledger corrections and an
outbox row), never by editing anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any

import psycopg

from metering.config import Settings
from metering.disputes import announce, audit, credits
from metering.errors import (
    FieldError,
    MeteringError,
    conflict,
    forbidden,
    not_found,
    validation_error,
)
from metering.keys import Principal, Scope
from metering.money import round_half_even_div
from metering.runs import find_run_id
from metering.settlement.settle import settle_runs

SUPPORT_SCOPES = (Scope.SUPPORT, Scope.ADMIN)


@dataclass(frozen=True, slots=True)
class Credit:
    """How much to credit: everything billed, an amount, or a percentage of what is billed."""

    full: bool = False
    amount_micros: int | None = None
    percent: str | None = None  # decimal text, e.g. "12.5"

    def micros(self, billed_micros: int) -> int:
        if self.full:
            return billed_micros
        if self.amount_micros is not None:
            if self.amount_micros <= 0:
                raise _bad("$.amount_micros", "must be a positive number of micro-USD")
            return self.amount_micros  # more than is billed is refused, never quietly cut
        try:
            percent = Decimal(self.percent or "")
        except InvalidOperation:
            raise _bad("$.percent", "must be a number between 0 and 100") from None
        if not percent.is_finite() or not Decimal(0) < percent <= Decimal(100):
            raise _bad("$.percent", "must be a number between 0 and 100")
        hundredths = int(percent * 100)  # basis points of a percent: two decimals kept
        return round_half_even_div(billed_micros * hundredths, 10_000)


def _bad(path: str, message: str) -> MeteringError:
    return validation_error([FieldError(path, "invalid_credit", message)])


@dataclass(frozen=True, slots=True)
class RunMoney:
    run_id: int
    subject: str
    customer_id: str
    outcome: str | None
    gross_micros: int  # of the decision in force
    billed_micros: int  # what the decision in force bills (the proposal while held)
    credited_micros: int
    held: bool

    def as_audit(self) -> dict[str, Any]:
        """The ledger's position, as the run page and statements show it: a held run has
        nothing billed yet, and the policy's proposal is named as one."""
        if self.held:
            return {
                "outcome": self.outcome,
                "billed_micros": 0,
                "credited_micros": 0,
                "held_micros": self.gross_micros,
                "proposed_billed_micros": self.billed_micros,
                "proposed_credited_micros": self.credited_micros,
            }
        return {
            "outcome": self.outcome,
            "billed_micros": self.billed_micros,
            "credited_micros": self.credited_micros,
            "held_micros": 0,
        }


def run_money(conn: psycopg.Connection[Any], run_id: int) -> RunMoney:
    row = conn.execute(
        """
        SELECT r.id, r.subject, r.customer_id, d.outcome, coalesce(d.gross_micros, 0),
               coalesce(d.billed_micros, 0), coalesce(d.credited_micros, 0)
        FROM runs r LEFT JOIN decisions d ON d.run_id = r.id AND d.version = r.decision_version
        WHERE r.id = %s
        """,
        (run_id,),
    ).fetchone()
    assert row is not None
    return RunMoney(*row, held=row[3] == "held_for_review")  # type: ignore[misc]


def _require_support(principal: Principal) -> None:
    if principal.scope not in SUPPORT_SCOPES:
        raise forbidden("support or admin scope is needed")


def locked_run_money(conn: psycopg.Connection[Any], run_id: int) -> RunMoney:
    """The run's amounts, read under its lock: they cannot change until the transaction
    ends, so a credit checked against them is the credit applied."""
    credits.lock_run(conn, run_id)
    return run_money(conn, run_id)


def credit_refusal(
    conn: psycopg.Connection[Any],
    principal: Principal,
    money: RunMoney,
    credit_micros: int,
    *,
    settings: Settings,
    now: datetime,
) -> MeteringError | None:
    """Why this credit would be refused (409 above what the run bills, 403 above a support
    limit, 422 when it rounds to nothing), or None. The console warns with it."""
    refusal = credits.over_billed(money.billed_micros, credit_micros)
    if refusal is None and credit_micros == 0:
        refusal = _bad("$.percent", "the credit rounds to 0 micro-USD")
    if refusal is None:
        already = credits.granted(conn, money.run_id, principal.tenant_id, money.customer_id, now)
        refusal = credits.over_limit(principal, credit_micros, already, settings)
    return refusal


def open_dispute(
    conn: psycopg.Connection[Any], principal: Principal, subject: str, claim: str
) -> int:
    _require_support(principal)
    if not claim.strip():
        raise _bad("$.claim", "describe the customer's claim")
    run_id = find_run_id(conn, principal, subject)
    money = run_money(conn, run_id)
    open_already = conn.execute(
        "SELECT id FROM disputes WHERE run_id = %s AND status = 'open'", (run_id,)
    ).fetchone()
    if open_already:
        raise conflict(
            "this run already has an open dispute", code="dispute_open", dispute_id=open_already[0]
        )
    row = conn.execute(
        "INSERT INTO disputes (tenant_id, customer_id, run_id, status, claim, opened_by) "
        "VALUES (%s, %s, %s, 'open', %s, %s) RETURNING id",
        (principal.tenant_id, money.customer_id, run_id, claim, principal.key_id),
    ).fetchone()
    assert row is not None
    run = announce.run_ref(principal, run_id, money.subject, money.customer_id)
    announce.dispute_opened(conn, run, principal, int(row[0]), claim)
    audit.record(
        conn,
        principal,
        action="dispute.open",
        target_type="run",
        target_id=subject,
        reason=claim,
        before=money.as_audit(),
        after={"dispute_id": row[0]},
    )
    return int(row[0])


def _dispute(conn: psycopg.Connection[Any], principal: Principal, dispute_id: int) -> Any:
    row = conn.execute(
        "SELECT id, run_id, status FROM disputes WHERE id = %s AND tenant_id = %s FOR UPDATE",
        (dispute_id, principal.tenant_id),
    ).fetchone()
    if row is None:
        raise not_found(f"no dispute {dispute_id}", code="dispute_not_found")
    if row[2] != "open":
        raise conflict(f"dispute {dispute_id} is already {row[2]}", code="dispute_resolved")
    return row


def _run_of_dispute(conn: psycopg.Connection[Any], principal: Principal, dispute_id: int) -> int:
    row = conn.execute(
        "SELECT run_id FROM disputes WHERE id = %s AND tenant_id = %s",
        (dispute_id, principal.tenant_id),
    ).fetchone()
    if row is None:
        raise not_found(f"no dispute {dispute_id}", code="dispute_not_found")
    return int(row[0])


def grant_credit(
    conn: psycopg.Connection[Any],
    principal: Principal,
    run_id: int,
    credit: Credit,
    *,
    reason: str,
    settings: Settings,
    now: datetime,
    action: str,
    dispute_id: int | None = None,
) -> tuple[int, int | None]:
    """Credit a run (releasing its hold, if held); returns (credit micros, new version).

    Credits on a run are serialised by its lock and measured against what it bills under
    that lock; one that is more than the run bills is refused (409 ``credit_exceeds_gross``),
    as is a support key's credit above a cumulative limit (403 ``credit_above_limit``). The
    credit is recorded against the usage the run has now, so it never reaches later usage.
    """
    _require_support(principal)
    if not reason.strip():
        raise _bad("$.reason", "give the reason the customer will see")
    before = locked_run_money(conn, run_id)
    micros = credit.micros(before.billed_micros)
    refusal = credit_refusal(conn, principal, before, micros, settings=settings, now=now)
    if refusal is not None:
        raise refusal
    credits.record_grant(conn, principal, run_id, micros, now)
    run = announce.run_ref(principal, run_id, before.subject, before.customer_id)
    announce.credit_granted(conn, run, principal, micros, reason, dispute_id)
    if before.held:  # a credit releases the hold too
        announce.run_released(conn, run, principal, before.as_audit()["held_micros"], reason)
    report = settle_runs(conn, [run_id], now=now, settings=settings, origin="support")
    after = run_money(conn, run_id)
    audit.record(
        conn,
        principal,
        action=action,
        target_type="run",
        target_id=before.subject,
        reason=reason,
        before=before.as_audit(),
        after=after.as_audit() | {"credit_micros": micros},
    )
    return micros, report.decided.get(run_id)


def approve_dispute(
    conn: psycopg.Connection[Any],
    principal: Principal,
    dispute_id: int,
    credit: Credit,
    *,
    reason: str,
    settings: Settings,
    now: datetime,
) -> None:
    _require_support(principal)
    # The run's lock before the dispute's, the order every credit path (and the console's
    # review of one) takes them in: two approvals of one dispute never wait in a cycle.
    credits.lock_run(conn, _run_of_dispute(conn, principal, dispute_id))
    _, run_id, _ = _dispute(conn, principal, dispute_id)
    micros, version = grant_credit(
        conn,
        principal,
        run_id,
        credit,
        reason=reason,
        settings=settings,
        now=now,
        action="dispute.approve",
        dispute_id=dispute_id,
    )
    conn.execute(
        "UPDATE disputes SET status = 'approved', resolved_by = %s, resolved_at = %s, "
        "resolution_reason = %s, credit_micros = %s, decision_version = %s WHERE id = %s",
        (principal.key_id, now, reason, micros, version, dispute_id),
    )
    money = run_money(conn, run_id)
    announce.dispute_resolved(
        conn,
        announce.run_ref(principal, run_id, money.subject, money.customer_id),
        principal,
        dispute_id,
        resolution="approved",
        credit_micros=micros,
        reason=reason,
    )


def reject_dispute(
    conn: psycopg.Connection[Any],
    principal: Principal,
    dispute_id: int,
    *,
    reason: str,
    now: datetime,
) -> None:
    """Rejecting changes no money; the reason is what the customer will see."""
    _require_support(principal)
    if not reason.strip():
        raise _bad("$.reason", "give the reason the customer will see")
    _, run_id, _ = _dispute(conn, principal, dispute_id)
    money = run_money(conn, run_id)
    conn.execute(
        "UPDATE disputes SET status = 'rejected', resolved_by = %s, resolved_at = %s, "
        "resolution_reason = %s WHERE id = %s",
        (principal.key_id, now, reason, dispute_id),
    )
    announce.dispute_resolved(
        conn,
        announce.run_ref(principal, run_id, money.subject, money.customer_id),
        principal,
        dispute_id,
        resolution="rejected",
        credit_micros=0,
        reason=reason,
    )
    audit.record(
        conn,
        principal,
        action="dispute.reject",
        target_type="run",
        target_id=money.subject,
        reason=reason,
        before=money.as_audit(),
        after=money.as_audit(),
    )


def release_hold(
    conn: psycopg.Connection[Any],
    principal: Principal,
    subject: str,
    *,
    reason: str,
    settings: Settings,
    now: datetime,
) -> int | None:
    """Bill a held run as the policy proposed (its R1–R3 credits stay)."""
    _require_support(principal)
    run_id = find_run_id(conn, principal, subject)
    before = locked_run_money(conn, run_id)  # customer, then run: settlement's order
    if not before.held:
        raise conflict("the run is not held for review", code="run_not_held")
    conn.execute("UPDATE runs SET support_released = true WHERE id = %s", (run_id,))
    run = announce.run_ref(principal, run_id, before.subject, before.customer_id)
    announce.run_released(conn, run, principal, before.as_audit()["held_micros"], reason)
    report = settle_runs(conn, [run_id], now=now, settings=settings, origin="support")
    audit.record(
        conn,
        principal,
        action="run.release",
        target_type="run",
        target_id=subject,
        reason=reason,
        before=before.as_audit(),
        after=run_money(conn, run_id).as_audit(),
    )
    return report.decided.get(run_id)


def credit_choice_error() -> MeteringError:
    return _bad("$", "give exactly one of full, amount_micros or percent")


def dispute_run_subject(
    conn: psycopg.Connection[Any], principal: Principal, dispute_id: int
) -> str:
    row = conn.execute(
        "SELECT r.subject FROM disputes d JOIN runs r ON r.id = d.run_id "
        "WHERE d.id = %s AND d.tenant_id = %s",
        (dispute_id, principal.tenant_id),
    ).fetchone()
    if row is None:
        raise not_found(f"no dispute {dispute_id}", code="dispute_not_found")
    return str(row[0])
