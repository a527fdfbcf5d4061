"""Support credits as controlled money: what may be granted, and the record of each grant.

A credit is checked and written under the run's lock (and its customer's, the order
settlement takes them in), so credits on one run, and the daily sum of one customer's
credits, are serialised: a credit is measured against what the run bills at that moment,
never against a figure another credit is about to change.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from metering.config import Settings
from metering.errors import MeteringError, credit_above_limit, credit_exceeds_gross
from metering.keys import Principal, Scope
from metering.money import describe_usd
from metering.settlement import repo


def lock_run(conn: psycopg.Connection[Any], run_id: int) -> None:
    """Lock the run for the rest of the transaction (its customer first, as settlement does,
    so a credit and a settlement never wait on each other in a cycle)."""
    repo.lock_customers(conn, [run_id])
    conn.execute("SELECT id FROM runs WHERE id = %s FOR UPDATE", (run_id,))


@dataclass(frozen=True, slots=True)
class Granted:
    """Support credits already granted, as the limits count them (by any key)."""

    on_run_micros: int
    to_customer_today_micros: int  # the customer's credits of the current UTC day


def utc_day(now: datetime) -> datetime:
    moment = now.astimezone(UTC)
    return datetime(moment.year, moment.month, moment.day, tzinfo=UTC)


def granted(
    conn: psycopg.Connection[Any], run_id: int, tenant_id: str, customer_id: str, now: datetime
) -> Granted:
    day = utc_day(now)
    row = conn.execute(
        """
        SELECT (SELECT coalesce(sum(amount_micros), 0) FROM support_credits
                WHERE run_id = %(run)s),
               (SELECT coalesce(sum(amount_micros), 0) FROM support_credits
                WHERE tenant_id = %(tenant)s AND customer_id = %(customer)s
                  AND granted_at >= %(day)s AND granted_at < %(next_day)s)
        """,
        {
            "run": run_id,
            "tenant": tenant_id,
            "customer": customer_id,
            "day": day,
            "next_day": day + timedelta(days=1),
        },
    ).fetchone()
    assert row is not None
    return Granted(int(row[0]), int(row[1]))


def over_billed(billed_micros: int, credit_micros: int) -> MeteringError | None:
    """409 when the credit is more than the run bills: it would credit more than its gross."""
    if billed_micros == 0:
        detail = "nothing billed is left to credit on this run"
    elif credit_micros > billed_micros:
        detail = (
            f"the run bills {describe_usd(billed_micros)} USD, so a credit of "
            f"{describe_usd(credit_micros)} USD would take its credited amount above its gross"
        )
    else:
        return None
    return credit_exceeds_gross(
        detail, creditable_micros=billed_micros, credit_micros=credit_micros
    )


def over_limit(
    principal: Principal, credit_micros: int, already: Granted, settings: Settings
) -> MeteringError | None:
    """403 when a support key's credit would take a cumulative limit above its maximum.

    Admin keys have no limit. Every earlier credit counts, whoever granted it: the limits
    bound what reaches a run or a customer without an admin, not what one key did.
    """
    if principal.scope is not Scope.SUPPORT:
        return None
    per_run = settings.support_credit_limit_micros
    if already.on_run_micros + credit_micros > per_run:
        return credit_above_limit(
            f"support credits on one run above {describe_usd(per_run)} USD in total need an "
            f"admin key: this run has {describe_usd(already.on_run_micros)} USD credited by "
            f"support and this credit is {describe_usd(credit_micros)} USD",
            limit="per_run",
            limit_micros=per_run,
            granted_micros=already.on_run_micros,
            credit_micros=credit_micros,
        )
    daily = settings.support_credit_customer_daily_limit_micros
    if already.to_customer_today_micros + credit_micros > daily:
        return credit_above_limit(
            f"support credits to one customer above {describe_usd(daily)} USD per day (UTC) "
            f"need an admin key: the customer has {describe_usd(already.to_customer_today_micros)}"
            f" USD credited today and this credit is {describe_usd(credit_micros)} USD",
            limit="per_customer_per_day",
            limit_micros=daily,
            granted_micros=already.to_customer_today_micros,
            credit_micros=credit_micros,
        )
    return None


def record_grant(
    conn: psycopg.Connection[Any],
    principal: Principal,
    run_id: int,
    credit_micros: int,
    now: datetime,
) -> None:
    """Store the grant against the usage lines the run has now, and release its hold.

    ``runs.support_credit_micros`` (the sum of the run's grants) changes in the same
    transaction: settlement reads it from the locked run to skip runs without grants.
    """
    conn.execute(
        """
        INSERT INTO support_credits (tenant_id, customer_id, run_id, grant_no, amount_micros,
                                     covers_line_id, granted_by, granted_by_scope, granted_at)
        SELECT r.tenant_id, r.customer_id, r.id,
               (SELECT count(*) + 1 FROM support_credits WHERE run_id = r.id),
               %(amount)s,
               (SELECT coalesce(max(id), 0) FROM usage_lines WHERE run_id = r.id),
               %(actor)s, %(scope)s, %(now)s
        FROM runs r WHERE r.id = %(run)s
        """,
        {
            "run": run_id,
            "amount": credit_micros,
            "actor": principal.key_id,
            "scope": principal.scope.value,
            "now": now,
        },
    )
    conn.execute(
        "UPDATE runs SET support_credit_micros = support_credit_micros + %s, "
        "support_released = true WHERE id = %s",
        (credit_micros, run_id),
    )
